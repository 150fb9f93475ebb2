"""What a tune leaves in its run dir: ``best.yaml`` and ``tune_report.md/.csv/.png``.

``best.yaml`` lists the winning overrides (on top of the command line the tune was given); train.py
takes it back as ``+tuned=PATH`` (see ``trainer.command_line.load_tuned``), and its header holds the same as a command
line to paste. The report has one row per probe: what was tried on which configuration, why (the
verdict that chose it), its speed-up over the configuration it was tried on with the interval, and
what was decided and why; then the path taken and the accuracy checks.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import platform
import shlex
import time
from pathlib import Path
from typing import Any, List

from trainer.measure.metrics import atomic_write_text
from trainer.report.rows import NOT_JUDGED, SEEDED_REPEATS, TIMING_ONLY
from trainer.tune.search import Outcome, Step

COLUMNS = [
    "step",
    "candidate",
    "group",
    "chosen_by",
    "tried",
    "decision",
    "why",
    "epoch_time_s",
    "compile_s",
    "speedup",
    "speedup_ci",
    "speedup_ci_holds",
    "vs_baseline",
    "val_acc",
    "time_to_target_s",
    "epochs_to_target",
    "dir",
]


def _row(step: Step) -> dict:
    return {
        "step": step.n,
        "candidate": step.candidate,
        "group": step.group,
        "chosen_by": step.chosen_by,
        "tried": " ".join(step.config) or "(as given)",
        "decision": step.decision,
        "why": step.why,
        "epoch_time_s": None if step.epoch_time_s is None else round(step.epoch_time_s, 4),
        "compile_s": None if not step.compile_s else round(step.compile_s, 2),
        "speedup": None if step.speedup is None else round(step.speedup, 3),
        "speedup_ci": f"{step.speedup_ci[0]:.3f}-{step.speedup_ci[1]:.3f}" if step.speedup_ci else None,
        "speedup_ci_holds": _holds(step),
        "vs_baseline": None if step.vs_baseline is None else round(step.vs_baseline, 3),
        "val_acc": None if step.val_acc is None else round(step.val_acc, 4),
        "time_to_target_s": None if step.time_to_target_s is None else round(step.time_to_target_s, 3),
        "epochs_to_target": step.epochs_to_target,
        "dir": step.dir,
    }


def _holds(step: Step) -> str | None:
    """What a probe's interval holds, in the A/B report's words (time_to_target_ci_holds): every probe
    trains with the configuration's one seed, so timing noise only; a speed-up without one is not judged."""
    if step.speedup is None:
        return None
    return TIMING_ONLY if step.speedup_ci else NOT_JUDGED


def command_line(user: List[str], winner: List[str]) -> str:
    return " ".join(["python train.py", *(shlex.quote(a) for a in user), *(shlex.quote(a) for a in winner)])


def write_best(run_dir: Path, user: List[str], outcome: Outcome, machine: str) -> Path:
    path = run_dir / "best.yaml"
    lines = [
        f"# trainer.tune on {machine}, {time.strftime('%Y-%m-%d %H:%M')}",
        f"# objective: {objective_text(outcome)}",
        f"# {outcome.verdict}",
        f"# use it:   {command_line(user, [f'+tuned={path}'])}",
        f"# or paste: {command_line(user, outcome.winner)}",
        "overrides:" + ("" if outcome.winner else " []"),
        *[f"  - {_yaml_str(ov)}" for ov in outcome.winner],
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def objective_text(outcome: Outcome) -> str:
    """The tune's objective in words (best.yaml's header and the report's)."""
    if outcome.objective == "time_to_target":
        return f"time_to_target (tune.objective): the training time to {outcome.target_how}"
    return "epoch_time (tune.objective): the time of a full training epoch"


def _yaml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string, quoted where it must be


def write_report(
    run_dir: Path, user: List[str], outcome: Outcome, machine: str, tune_cfg: Any, wall_s: float
) -> List[Path]:
    rows = [_row(s) for s in outcome.steps]
    md = [
        "# Tune report",
        "",
        f"Machine: {machine}. Command line: `{command_line(user, [])}`. Tune time: {wall_s / 60:.1f} min (budget {tune_cfg.budget_min:g} min).",
        f"Objective: {objective_text(outcome)}.",
        _probes_text(outcome, tune_cfg),
        "",
        f"**Verdict:** {outcome.verdict}",
        "",
        "## Path taken",
        "",
    ]
    for i, config in enumerate(outcome.path):
        md.append(f"{i}. {' '.join(config) or '(the configuration as given)'}")
    md += ["", "## Every probe", "", "| " + " | ".join(COLUMNS[:-1]) + " |", "|" + "---|" * (len(COLUMNS) - 1)]
    for r in rows:
        md.append("| " + " | ".join("" if r[c] is None else str(r[c]).replace("|", "/") for c in COLUMNS[:-1]) + " |")
    md += ["", "Run dirs of the probes are in tune_report.csv (column `dir`)."]
    out = [run_dir / "tune_report.md", run_dir / "tune_report.csv", run_dir / "tune_report.png"]
    atomic_write_text(out[0], "\n".join(md) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out[1], buf.getvalue())
    try:
        _png(out[2], outcome)
    except Exception as e:  # the chart is a convenience: the table and best.yaml are the result
        logging.getLogger("trainer.tune").warning("tune_report.png was not drawn (%s: %s)", type(e).__name__, e)
        return out[:2]
    return out


def _probes_text(outcome: Outcome, tune_cfg: Any) -> str:
    kept = (
        "A candidate is kept when the 95% bootstrap interval of its speed-up over the configuration it was tried on "
        "lies above 1.00, measured twice."
    )
    if outcome.objective == "time_to_target":
        return (
            f"Probes: each trains the configuration's schedule (tune.verify_epochs={tune_cfg.verify_epochs} epochs, validated "
            "every epoch) until its val_acc reaches the target (stop_at_acc); its time to target is the training time up to "
            "that epoch, warm-up and compile included, validation apart. One that never reaches it is dropped. "
            + kept
            + " "
            f"Judged on one seed: the interval holds timing noise only (speedup_ci_holds: {TIMING_ONLY}; the epochs after "
            "the warm-up resampled), not the seeds' say in how many epochs the target takes, since every probe trains "
            "with the configuration's seed. To judge the winner across seeds, sweep it against the configuration as "
            f"given with {SEEDED_REPEATS} (python train.py -m ...)."
        )
    return (
        f"Probes: {tune_cfg.probe_epochs} epochs of {tune_cfg.probe_batches} steps each, the first a warm-up; times are scaled to "
        f"a full epoch of the run, compile time spread over {tune_cfg.horizon_epochs} epochs. " + kept
    )


def _png(path: Path, outcome: Outcome) -> None:
    """Each probe's speed-up over the configuration it was tried on, coloured by what was decided."""
    # lazy: matplotlib (about 0.3 s) only where the chart is drawn, its backend chosen first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    steps = [s for s in outcome.steps if s.speedup is not None]
    colors = {"kept": "#2e7d32", "dropped": "#9e9e9e", "final": "#1f4e9c"}
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(steps) + 1.6))
    labels = [f"{s.n} {s.candidate}" for s in steps]
    values = [s.speedup for s in steps]
    errors = [
        [max(0.0, s.speedup - s.speedup_ci[0]) if s.speedup_ci else 0.0 for s in steps],
        [max(0.0, s.speedup_ci[1] - s.speedup) if s.speedup_ci else 0.0 for s in steps],
    ]
    ax.barh(range(len(steps)), values, color=[colors.get(s.decision, "#d9534f") for s in steps], xerr=errors, capsize=3)
    ax.axvline(1.0, color="#333333", linewidth=1)
    for y, s in enumerate(steps):
        ax.text(s.speedup + errors[1][y] + 0.02, y, f"{s.speedup:.2f}x {s.decision}", va="center", fontsize=8)
    ax.set_yticks(range(len(steps)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    what = "time-to-target speed-up" if outcome.objective == "time_to_target" else "speed-up"
    ax.set_xlabel(f"{what} over the configuration it was tried on (final: winner vs as given); 95% interval")
    ax.set_title("trainer.tune: kept (green), dropped (grey), final (blue)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_name(hardware: Any) -> str:
    return (
        f"{hardware.name} ({hardware.accelerator}, {hardware.cpu_cores} cores usable), {platform.node() or 'this host'}"
    )
