"""The A/B report: one table of epoch times, speedups and accuracy, built from metrics.json files.

It reads every job's ``metrics.json`` from disk, so it works for any launcher (jobs in other
processes or machines) and for runs from different sweeps and days side by side:

    python -m trainer.report multirun/2026-11-22/10-00-00 [more dirs ...] [--out DIR]

After a sweep, ``ABReportCallback`` (a Hydra callback, ``on_multirun_end``) writes
``ab_report.md``, ``ab_report.csv`` and ``ab_report.png`` into the sweep dir and prints the table.

The baseline row is the job with every varied key at its "off" value (the schema default), else
the first job. Spread is the min-max of a job's steady (non-warm-up) epochs; a speedup whose
spread overlaps the baseline's is flagged as within the noise. This module does not import torch.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .metrics import atomic_write_text

log = logging.getLogger(__name__)

ACC_DROP_THRESHOLD = 0.02  # absolute val_acc drop vs baseline that marks a row
# Run-to-run variation is larger than the spread of one run's few epochs (the same configuration run
# twice on the 2-core build machine differed by 2.9% and 4.9%, with 1-2% min-max spreads), so a speedup is
# "within noise" unless it clears both the spreads and this floor.
NOISE_FLOOR = 0.05
FEW_STEPS = 10  # fewer steps per epoch than this: timing is dominated by per-epoch overheads
REPORT_NAMES = ("ab_report.md", "ab_report.csv", "ab_report.png")
# overrides that are not settings of the job (where it writes, which job it is)
_IGNORED_OVERRIDE_PREFIXES = ("hydra.", "ckpt_path")


@dataclass
class Job:
    path: Path
    metrics: Dict[str, Any]
    settings: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.metrics.get("status") == "ok"

    def steady_times(self) -> List[float]:
        epochs = self.metrics.get("epochs") or []
        steady = [e["time_s"] for e in epochs if not e.get("warmup")]
        return steady


def find_metrics(dirs: Sequence[str]) -> List[Path]:
    """metrics.json files in the given run dirs or sweep dirs (any depth), in a stable order."""
    found: List[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_file() and p.name == "metrics.json":
            found.append(p)
        elif (p / "metrics.json").is_file():
            found.append(p / "metrics.json")
        elif p.is_dir():
            found.extend(sorted(p.rglob("metrics.json"), key=lambda q: _natural_key(q.relative_to(p))))
    return found


def _natural_key(path: Path):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def _parse_value(text: str) -> Any:
    try:
        import yaml

        return yaml.safe_load(text)
    except Exception:
        return text


def _settings(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """What this job was asked to run: its flags plus every key=value override it was given."""
    settings = dict(metrics.get("flags") or {})
    for ov in metrics.get("overrides") or []:
        if "=" not in ov:
            continue
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith(_IGNORED_OVERRIDE_PREFIXES):
            continue
        settings[key] = _parse_value(value)
    settings.setdefault("recipe", metrics.get("recipe"))
    world = (metrics.get("device") or {}).get("count")
    if world is not None:
        settings.setdefault("world_size", world)
    return settings


def load_jobs(dirs: Sequence[str]) -> List[Job]:
    jobs = []
    for path in find_metrics(dirs):
        try:
            metrics = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            metrics = {"status": "failed", "error": f"unreadable metrics.json: {e}"}
        jobs.append(Job(path.parent, metrics, _settings(metrics)))
    return jobs


def _off_value(key: str) -> Any:
    """The "optimization off" value of a key: its schema default (None if the schema does not know it)."""
    return _schema_defaults().get(key)


_DEFAULTS_CACHE: Dict[str, Any] = {}


def _schema_defaults() -> Dict[str, Any]:
    if not _DEFAULTS_CACHE:
        from omegaconf import OmegaConf

        from .config import SCHEMA_KEYS, TrainSchema

        schema = OmegaConf.structured(TrainSchema)
        for key in SCHEMA_KEYS:
            try:
                value = OmegaConf.select(schema, key)
            except Exception:
                continue
            if not OmegaConf.is_config(value):
                _DEFAULTS_CACHE[key] = value
    return _DEFAULTS_CACHE


def varied_keys(jobs: List[Job]) -> List[str]:
    keys: List[str] = []
    for job in jobs:
        for k in job.settings:
            if k not in keys:
                keys.append(k)
    varied = []
    for k in keys:
        values = {json.dumps(job.settings.get(k, _off_value(k)), sort_keys=True, default=str) for job in jobs}
        if len(values) > 1:
            varied.append(k)
    return varied


def pick_baseline(jobs: List[Job], varied: List[str]) -> Optional[Job]:
    """The first job with every varied key at its off value (keys without one are ignored), else the first ok job."""
    known = [k for k in varied if _off_value(k) is not None]
    for job in jobs:
        if job.ok and all(job.settings.get(k, _off_value(k)) == _off_value(k) for k in known):
            return job
    return next((j for j in jobs if j.ok), None)


# decimals per numeric column in the markdown table (the CSV keeps full precision)
_DIGITS = {"epoch_time_s": 3, "speedup": 2, "samples_per_s": 1, "data_wait_fraction": 3, "peak_memory_mb": 0, "val_acc": 3}


def _fmt(value: Any, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if column == "speedup":
            return f"{value:.2f}x"
        return f"{value:.{_DIGITS.get(column, 3)}f}"
    return str(value)


def build_rows(jobs: List[Job], acc_drop: float = ACC_DROP_THRESHOLD) -> tuple:
    """Return (columns, rows as dicts, baseline job)."""
    varied = varied_keys(jobs)
    base = pick_baseline(jobs, varied)
    base_time = base.metrics.get("epoch_time_s") if base else None
    base_spread = _spread(base) if base else None
    base_acc = base.metrics.get("val_acc") if base else None
    columns = ["job"] + varied + (["world_size"] if "world_size" not in varied else []) + [
        "epoch_time_s", "spread_s", "speedup", "samples_per_s", "data_wait_fraction", "peak_memory_mb", "val_acc", "bottleneck", "status", "notes",
    ]
    rows = []
    for job in jobs:
        m = job.metrics
        notes: List[str] = []
        t = m.get("epoch_time_s")
        spread = _spread(job)
        speedup = round(base_time / t, 3) if (job.ok and t and base_time) else None
        base_samples, samples = _epoch_samples(base) if base else None, _epoch_samples(job)
        if speedup is not None and base_samples and samples and samples != base_samples:
            # epochs of different sizes (a batch-size change with trainer.limit_train_batches as a
            # count): compare throughput, not epoch time
            speedup = round(m["samples_per_s"] / base.metrics["samples_per_s"], 3)
            notes.append(f"epochs differ in size ({samples} vs {base_samples} samples): speedup from samples/s")
        if job is base:
            notes.append("baseline")
        elif speedup is not None and (abs(speedup - 1) < NOISE_FLOOR or (spread and base_spread and _overlap(spread, base_spread))):
            notes.append("within noise")
        if job.ok and not job.steady_times():
            notes.append("warm-up only: 1 epoch, not steady state")
        steps = [e.get("steps") for e in (m.get("epochs") or []) if e.get("steps")]
        if job.ok and steps and max(steps) < FEW_STEPS:
            notes.append(f"only {max(steps)} steps/epoch")
        acc = m.get("val_acc")
        if job.ok and acc is not None and base_acc is not None and base_acc - acc > acc_drop:
            notes.append(f"ACCURACY DROP {acc - base_acc:+.3f}")
        if m.get("compile_time_s"):
            notes.append(f"compile {m['compile_time_s']:.1f} s")
        if not job.ok:
            notes.append(str(m.get("error") or "failed"))
        row = {"job": _job_name(job)}
        row.update({k: job.settings.get(k, _off_value(k)) for k in varied})
        row.setdefault("world_size", (m.get("device") or {}).get("count"))
        row.update(
            epoch_time_s=t if job.ok else None,
            spread_s=f"{spread[0]:.3f}-{spread[1]:.3f}" if spread else None,
            speedup=speedup,
            samples_per_s=m.get("samples_per_s") if job.ok else None,
            data_wait_fraction=m.get("data_wait_fraction") if job.ok else None,
            peak_memory_mb=m.get("peak_memory_mb"),
            val_acc=acc,
            bottleneck=(m.get("diagnosis") or {}).get("bottleneck"),
            status=m.get("status", "failed"),
            notes="; ".join(notes),
        )
        rows.append(row)
    return columns, rows, base


def _epoch_samples(job: Job) -> Optional[int]:
    epochs = [e for e in job.metrics.get("epochs") or [] if not e.get("partial")]
    return epochs[-1].get("samples") if epochs else None


def _job_name(job: Job) -> str:
    return job.path.name if job.path.name.isdigit() else str(job.path)


def _spread(job: Job) -> Optional[tuple]:
    times = job.steady_times()
    return (min(times), max(times)) if len(times) >= 2 else None


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def to_markdown(columns: List[str], rows: List[dict]) -> str:
    out = io.StringIO()
    out.write("| " + " | ".join(columns) + " |\n")
    out.write("|" + "|".join(" --- " for _ in columns) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(_fmt(row.get(c), c).replace("|", "/") for c in columns) + " |\n")
    return out.getvalue()


def to_csv(columns: List[str], rows: List[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns)
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return out.getvalue()


def _label(row: dict, varied: List[str]) -> str:
    """A readable bar label: the varied settings of this row (paths shortened), wrapped."""
    import textwrap

    parts = []
    for k in varied:
        value = row.get(k)
        if value is None:
            continue
        text = _fmt(value, k)
        if "/" in text:
            text = "…/" + text.rstrip("/").rsplit("/", 1)[-1]
        parts.append(f"{k}={text}")
    return "\n".join(textwrap.wrap(", ".join(parts), 48)) if parts else row["job"]


def to_png(path: Path, columns: List[str], rows: List[dict]) -> None:
    """Horizontal bars of epoch time per configuration, the speedup written on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    varied = [c for c in columns[1 : columns.index("epoch_time_s")] if c != "world_size" or len({r.get(c) for r in rows}) > 1]
    labels = [_label(r, varied) for r in rows]
    times = [r["epoch_time_s"] or 0.0 for r in rows]
    lines = sum(max(1, label.count("\n") + 1) for label in labels)
    fig, ax = plt.subplots(figsize=(11, 0.32 * lines + 0.25 * len(rows) + 1.6))
    ypos = range(len(rows))
    colors = ["#9e9e9e" if "baseline" in r["notes"] else ("#d9534f" if r["status"] != "ok" else "#4c72b0") for r in rows]
    errors = [[0.0] * len(rows), [0.0] * len(rows)]
    for i, r in enumerate(rows):
        if r.get("spread_s") and r["epoch_time_s"]:
            lo, hi = (float(x) for x in r["spread_s"].split("-"))
            errors[0][i], errors[1][i] = max(0.0, r["epoch_time_s"] - lo), max(0.0, hi - r["epoch_time_s"])
    ax.barh(list(ypos), times, color=colors, xerr=errors, ecolor="#333333", capsize=3)
    top = max(times) if any(times) else 1.0
    for y, r, t in zip(ypos, rows, times):
        if r["status"] != "ok":
            text = "FAILED"
        elif r["speedup"] is not None:
            text = f"{t:.3g} s   {r['speedup']:.2f}x" + (" (noise)" if "within noise" in r["notes"] else "")
        else:
            text = f"{t:.3g} s"
        ax.text(t + errors[1][y] + top * 0.015, y, text, va="center", fontsize=9)
    ax.set_yticks(list(ypos))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel("epoch time (s), median of steady epochs; lower is better")
    ax.set_title("A/B: epoch time and speedup vs baseline (grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(dirs: Sequence[str], out_dir: str, echo: bool = True) -> Optional[str]:
    """Build the report from ``dirs`` into ``out_dir``; return the markdown (None if no jobs)."""
    jobs = load_jobs(dirs)
    out = Path(out_dir)
    if not jobs:
        log.warning("no metrics.json found under %s: no report written", ", ".join(map(str, dirs)))
        return None
    columns, rows, base = build_rows(jobs)
    device = next((j.metrics.get("device") for j in jobs if j.metrics.get("device")), None) or {}
    header = (
        f"# A/B report\n\n{len(jobs)} job(s) on {device.get('accelerator', '?')} ({device.get('name', '?')}). "
        f"Baseline: job {_job_name(base) if base else '-'}. epoch_time_s is the median of the steady (non-warm-up) "
        f"epochs; spread_s is their min-max; a speedup within {NOISE_FLOOR:.0%} of 1.00x, or whose spread overlaps the baseline's, is marked 'within noise'; "
        f"rows whose val_acc fell more than {ACC_DROP_THRESHOLD} below the baseline are marked ACCURACY DROP.\n\n"
    )
    markdown = header + to_markdown(columns, rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "ab_report.md", markdown)
    atomic_write_text(out / "ab_report.csv", to_csv(columns, rows))
    try:
        to_png(out / "ab_report.png", columns, rows)
    except Exception as e:  # the chart is a convenience; the table is the product
        log.warning("could not draw ab_report.png: %s", e)
    if echo:
        print("\n" + to_markdown(columns, rows) + f"\nreport: {out / 'ab_report.md'} (.csv, .png)\n", flush=True)
    return markdown


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra is a dependency; keeps `python -m trainer.report` importable alone
    _HydraCallback = object  # type: ignore[misc,assignment]


class ABReportCallback(_HydraCallback):
    """Hydra callback: warn about parallel launchers; write the A/B report when a sweep ends."""

    def on_multirun_start(self, config, **kwargs) -> None:
        launcher = str(config.hydra.launcher.get("_target_", ""))
        if "BasicLauncher" not in launcher:
            log.warning(
                "hydra/launcher=%s may run jobs in parallel: their epoch times would interfere with each other. "
                "For timing sweeps keep the default launcher (jobs one after another).",
                launcher.rsplit(".", 1)[-1],
            )

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = config.hydra.sweep.dir
        write_report([sweep_dir], sweep_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.report", description="Rebuild the A/B report from sweep or run dirs.")
    parser.add_argument("dirs", nargs="+", help="sweep dirs, run dirs or metrics.json files")
    parser.add_argument("--out", help="where to write ab_report.* (default: the single dir given, else the current dir)")
    args = parser.parse_args(argv)
    missing = [d for d in args.dirs if not os.path.exists(d)]
    if missing:
        print(f"error: no such dir: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 and os.path.isdir(args.dirs[0]) else ".")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return 0 if write_report(args.dirs, out) is not None else 1


if __name__ == "__main__":
    sys.exit(main())
