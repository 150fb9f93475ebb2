"""Write a recipe's RESULTS.md and results.json from the sweeps scripts/gpu_check.sh ran; print the check's summary.

    python scripts/gpu_results.py --recipe resnet50 --sweeps OUT/resnet50/synthetic OUT/resnet50/jpeg --out recipes/resnet50 [--tests OUT/gpu_tests.xml]
    python scripts/gpu_results.py --summary recipes/resnet50/results.json recipes/vit/results.json

Each sweep dir is a `train.py -m ... +bench=ROW,...` sweep (its A/B report already written by the
sweep) with a `command.txt` holding the exact command. RESULTS.md gets: where it ran (device,
driver, torch, CUDA, Lightning, date, commit), the GPU tests' outcome, one compact table per sweep
(the `bench` row, batch, epoch time, samples/s, speedup over the all-off baseline with its interval,
MFU, data-wait and transfer shares, peak memory, val_acc and the doctor's verdict), the headline
numbers against the targets, the commands, and the chart of each sweep copied beside it as
`<sweep>.png`. results.json holds the same, for machines: the environment, the tests, and per table
its rows and its best row.

    python scripts/gpu_results.py --recipe resnet50 --sweeps ... --out recipes/resnet50 \
        --environment-from recipes/resnet50/results.json --note "what the tables cannot say"

A run that measures some parts only (the tests, the headline and the ceiling; or one table) keeps
the other parts of the page already in ``--out``, each headed with the earlier run that measured it:

    python scripts/gpu_results.py --recipe resnet50 --out recipes/resnet50 --tests OUT/gpu_tests.xml \
        --headline OUT/headline/metrics.json --ceiling OUT/ceiling.json

``--note`` (repeatable) adds a maintainer's note on the run (a row stopped by the check's time limit,
what a short epoch hides) under "Notes on this run". ``--environment-from`` takes the device,
driver, torch, date and commit from a results.json written where the sweeps ran, so the page can be
written again elsewhere from the same sweep dirs (with a note added) without naming this machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer import report  # noqa: E402
from trainer.report.render import format_cell  # noqa: E402  (numbers written as the A/B table writes them)

# what each sweep name measures (gpu_check.sh's tables)
TABLES = {
    "synthetic": "Synthetic {size} px images kept on the device (`data.device_resident=true`): no input pipeline at all, the model's ceiling.",
    "jpeg": "The built-in real JPEGs at {size} px (`data=builtin`), decoded and augmented every step, whole epochs: "
    "`all_turbo` decodes with libjpeg-turbo in the loader workers, `all` with nvJPEG on the GPU (batched crop, "
    "flip and resize there), `dali` with NVIDIA DALI where installed; every other flag on. The honest end-to-end number.",
    "jpeg_baseline": "The same JPEGs with every optimization off (fp32, PIL, no loader workers): the all-off row of "
    "the end-to-end comparison, under a step limit (with no workers a step limit builds nothing past it).",
    "jpeg_packed": "The same images packed once (`python -m trainer.pack`, uint8 at {size} px) and trained with every "
    "flag on: no decode at all.",
    "jpeg_synthetic": "Device-resident synthetic images, as many as the JPEG set's, at the same batch cap and flags: "
    "what the model does when the input costs nothing, beside the JPEG rows.",
}
# our aims on one H100: images/s of the fastest synthetic row; the best real-JPEG all-on row, in
# images/s and against the synthetic all-on row at the same batch; all-on vs all-off end to end;
# the README's headline against the device-resident row (5,571 images/s, bf16 + channels_last +
# compile at batch 256, one H100, 2026-11-27) with its data wait; the trainer against a
# hand-written loop on the same work (scripts/bench_ceiling.py)
TARGETS = {
    "resnet50": {
        "synthetic_samples_per_s": 6500,
        "jpeg_speedup": 10.0,
        "jpeg_samples_per_s": 5000,
        "jpeg_of_synthetic": 0.9,
        "headline_of_device_resident": 0.9,
        "device_resident_samples_per_s": 5571,
        "headline_data_wait": 0.05,
        "ceiling_ratio": 1.0,
    },
    "vit": {"synthetic_samples_per_s": 1800, "jpeg_speedup": 10.0},
}
JPEG_ALL_ON = ("all", "all_turbo", "dali")  # the JPEG table's all-on rows
ANCHORS = (
    "Published anchors: ResNet-50 training on one A100 runs at about 938 img/s in TF32 and 2,470 img/s with AMP "
    "(NVIDIA DeepLearningExamples); torch.compile's published training speed-up on A100 is about 1.43x "
    "(geometric mean over 163 models)."
)
COLUMNS = [
    "bench",
    "batch",
    "epoch_time_s",
    "samples_per_s",
    "speedup",
    "speedup_ci",
    "mfu",
    "data_wait_fraction",
    "transfer_fraction",
    "peak_memory_mb",
    "val_acc",
    "bottleneck",
    "status",
    "notes",
]


def _driver() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "none (no NVIDIA driver on this machine)"


def environment(jobs: List[report.Job], ceiling_result: Optional[Path] = None) -> Dict[str, str]:
    """Where this run ran: from its jobs' metrics, or (a run of the ceiling alone) the benchmark's machine."""
    import pytorch_lightning as pl
    import torch

    device = next((j.metrics.get("device") for j in jobs if j.metrics.get("device")), None) or {}
    if not device and ceiling_result is not None and ceiling_result.exists():
        name = json.loads(ceiling_result.read_text()).get("machine", {}).get("device")
        device = {"name": name, "accelerator": "cpu" if name == "cpu" else "cuda", "count": 1}
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "device": f"{device.get('name', '?')} ({device.get('accelerator', '?')}, {device.get('count', 1)} device)",
        "driver": _driver(),
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "lightning": pl.__version__,
        "date": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "commit": commit or "?",
    }


def compact_rows(jobs: List[report.Job]) -> List[dict]:
    _, rows, _ = report.build_rows(jobs)
    out = []
    for job, row in zip(jobs, rows):
        out.append(
            {
                "bench": job.settings.get("bench", row["job"]),
                "batch": job.metrics.get("batch_size"),
                **{k: row.get(k) for k in COLUMNS if k not in ("bench", "batch", "mfu")},
                "mfu": job.metrics.get("mfu"),
                "verdict": (job.metrics.get("diagnosis") or {}).get("verdict"),
                "peak_flops_source": job.metrics.get("peak_flops_source"),
            }
        )
    return out


def test_outcome(xml_path: Optional[Path]) -> Dict[str, object]:
    """The GPU-marked tests' outcome from pytest's JUnit XML (absent: not run)."""
    if xml_path is None or not xml_path.exists():
        return {"ran": False}
    import xml.etree.ElementTree as ET

    cases = ET.parse(xml_path).getroot().iter("testcase")
    outcome: Dict[str, object] = {"ran": True, "passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome["failed"] += 1
            problem = case.find("failure") if case.find("failure") is not None else case.find("error")
            outcome["failures"].append({"test": name, "message": (problem.get("message") or "")[:300]})
        elif case.find("skipped") is not None:
            outcome["skipped"] += 1
        else:
            outcome["passed"] += 1
    return outcome


def best_row(rows: List[dict]) -> Optional[dict]:
    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"]]
    return max(ok, key=lambda r: r["samples_per_s"]) if ok else None


def _row(rows: List[dict], bench: str) -> Optional[dict]:
    return next((r for r in rows if r["bench"] == bench and r["status"] == "ok"), None)


def headline(recipe: str, name: str, rows: List[dict], dry_run: bool = False) -> List[str]:
    lines = []
    base, every = _row(rows, "baseline"), _row(rows, "all")
    ok = [r for r in rows if r["status"] == "ok" and r["samples_per_s"]]
    if ok:
        best = max(ok, key=lambda r: r["samples_per_s"])
        lines.append(
            f"fastest row: `{best['bench']}` at {best['samples_per_s']:.0f} samples/s ({format_cell(best['speedup'], 'speedup')} over the baseline)"
        )
    if base and every:
        lines.append(
            f"all on vs all off: {every['samples_per_s']:.0f} vs {base['samples_per_s']:.0f} samples/s, "
            f"{format_cell(every['speedup'], 'speedup')}; the doctor says `{every['bottleneck']}` with everything on"
        )
    target = {} if dry_run else TARGETS.get(recipe, {})  # a CPU dry run is not read against GPU targets
    if name == "synthetic" and "synthetic_samples_per_s" in target and ok:
        goal = target["synthetic_samples_per_s"]
        got = max(r["samples_per_s"] for r in ok)
        lines.append(
            f"target {goal:,} img/s on synthetic data: {'reached' if got >= goal else 'not reached'} ({got:,.0f} img/s)"
        )
    best = max(ok, key=lambda r: r["samples_per_s"]) if ok else None
    if best and best.get("mfu") is not None:
        lines.append(f"MFU of the fastest row: {best['mfu']:.1%} ({best.get('peak_flops_source')})")
    failed = [r["bench"] for r in rows if r["status"] != "ok"]
    if failed:
        lines.append(f"rows that failed: {', '.join(failed)} (their errors are in the table)")
    return lines


def jpeg_targets(recipe: str, tables: Dict[str, dict], dry_run: bool = False) -> List[str]:
    """The end-to-end targets, read across the JPEG tables: the best all-on row from real images
    (decoded or packed) in images/s and against the synthetic all-on row at the same batch, and
    all-on against the all-off baseline."""
    target = {} if dry_run else TARGETS.get(recipe, {})
    rows = [
        r
        for name in ("jpeg", "jpeg_packed")
        for r in tables.get(name, {}).get("rows", [])
        if r["status"] == "ok" and r["samples_per_s"] and r["bench"] in JPEG_ALL_ON
    ]
    if not rows:
        return []
    best = max(rows, key=lambda r: r["samples_per_s"])
    label = f"`{best['bench']}`" + (" (packed)" if best in tables.get("jpeg_packed", {}).get("rows", []) else "")
    lines = [
        f"best real-image all-on row: {label} at {best['samples_per_s']:,.0f} images/s, batch {best['batch']}, "
        f"data wait {format_cell(best['data_wait_fraction'])}, transfer {format_cell(best['transfer_fraction'])}, val_acc {format_cell(best['val_acc'])}"
    ]
    synthetic = _row(tables.get("jpeg_synthetic", {}).get("rows", []), "all")
    if synthetic:
        share = best["samples_per_s"] / synthetic["samples_per_s"]
        goal = target.get("jpeg_of_synthetic")
        lines.append(
            f"against the synthetic all-on row at batch {synthetic['batch']} ({synthetic['samples_per_s']:,.0f} images/s): "
            f"{share:.0%}" + (f" (target {goal:.0%}: {'met' if share >= goal else 'not met'})" if goal else "")
        )
    if "jpeg_samples_per_s" in target:
        goal = target["jpeg_samples_per_s"]
        lines.append(
            f"target {goal:,} images/s from real images: {'met' if best['samples_per_s'] >= goal else 'not met'}"
        )
    base = _row(tables.get("jpeg_baseline", {}).get("rows", []), "baseline")
    if base and base["samples_per_s"]:
        ratio = best["samples_per_s"] / base["samples_per_s"]
        goal = target.get("jpeg_speedup")
        lines.append(
            f"all on vs all off on the same JPEGs: {best['samples_per_s']:,.0f} vs {base['samples_per_s']:,.0f} images/s, "
            f"{ratio:.2f}x" + (f" (target {goal:.0f}x: {'met' if ratio >= goal else 'not met'})" if goal else "")
        )
    learning = [r for r in rows if r.get("val_acc") is not None]
    if learning:
        lines.append(
            "val_acc of the all-on rows (chance 0.10): "
            + ", ".join(f"`{r['bench']}` {format_cell(r['val_acc'])}" for r in learning)
        )
    return lines


def write(
    recipe: str,
    sweeps: List[Path],
    out: Path,
    dry_run: bool = False,
    tests: Optional[Path] = None,
    notes: Optional[List[str]] = None,
    environment_from: Optional[Path] = None,
    headline_metrics: Optional[Path] = None,
    ceiling_result: Optional[Path] = None,
) -> Path:
    """The page and results.json of one run, merged into the page already in ``out``.

    ``headline_metrics`` / ``ceiling_result``: this run's headline metrics.json and
    scripts/bench_ceiling.py result, read against their targets. GPU time comes in short contacts,
    so a run often measures some parts only (the tests and the headline; or a table and the
    ceiling): what it measured replaces those parts, and every part it did not measure (a table, the
    checks, the tests' outcome) is kept from the page before, headed with the run that measured it
    (``table_runs``, ``checks_run``, ``tests_run`` in results.json), so the page never passes an
    earlier run's numbers as this one's."""
    out.mkdir(parents=True, exist_ok=True)
    before = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    earlier = json.loads(environment_from.read_text()) if environment_from else {}
    measured, all_jobs = [], []
    for sweep in sweeps:
        jobs = report.load_jobs([str(sweep)])
        if not jobs:
            raise SystemExit(f"no metrics.json under {sweep}: did the sweep run?")
        all_jobs += jobs
        measured.append((sweep, jobs))
    described = all_jobs
    if not described and headline_metrics is not None and headline_metrics.exists():  # no sweep: the headline ran here
        described = report.load_jobs([str(headline_metrics.parent)])
    env = earlier.get("environment") or environment(described, ceiling_result)
    runs_before = _part_runs(before)
    sections, tables, table_runs = [], {}, {}
    for sweep, jobs in measured:
        name = sweep.name
        rows = compact_rows(jobs)
        chart = sweep / "ab_report.png"
        if chart.exists():
            shutil.copyfile(chart, out / f"{name}.png")
        command = (sweep / "command.txt").read_text().strip() if (sweep / "command.txt").exists() else "(not recorded)"
        every = _row(rows, "all")
        tables[name] = {
            "command": command,
            "rows": rows,
            "best": best_row(rows),
            "all_vs_baseline": every["speedup"] if every else None,
            "headline": headline(recipe, name, rows, dry_run),
        }
        table_runs[name] = env
        size = (jobs[0].metrics.get("data") or {}).get("image_size", "?")
        sections.append(_table_section(name, tables[name], out, TABLES.get(name, "").format(size=size)))
    for name, table in (before.get("tables") or {}).items():
        if name not in tables:  # not measured by this run: kept, under the run that measured it
            tables[name], table_runs[name] = table, runs_before["tables"].get(name)
            sections.append(_table_section(name, table, out, f"From an earlier run: {_run_label(table_runs[name])}."))
    across = jpeg_targets(recipe, tables, dry_run)
    if across:
        kept = sorted(n for n in tables if n.startswith("jpeg") and table_runs[n] is not env)
        heading = "## Real JPEGs end to end: the targets" + (
            f" (with {', '.join(kept)} from an earlier run)" if kept else ""
        )
        sections.insert(0, "\n".join([heading, "", *[f"- {line}" for line in across], ""]))
    checks, checks_run = {}, {}
    for kind, path, line in (("headline", headline_metrics, headline_line), ("ceiling", ceiling_result, ceiling_line)):
        if path is not None:
            checks[kind], checks_run[kind] = (line(path) if path.exists() else f"no result: {path}"), env
        elif kind in runs_before["checks"]:  # not measured by this run: kept, under the run that measured it
            checks[kind], checks_run[kind] = runs_before["checks"][kind]
    if checks:
        said = [
            checks[kind]
            + ("" if checks_run[kind] is env else f" (from an earlier run: {_run_label(checks_run[kind])})")
            for kind in checks
        ]
        sections.insert(0, "\n".join(["## The model's ceiling: the targets", "", *[f"- {c}" for c in said], ""]))
    outcome, tests_run = test_outcome(tests) if tests is not None else {"ran": False}, env
    if not outcome.get("ran") and earlier.get("tests", {}).get("ran"):  # the same run, its page written elsewhere
        outcome = earlier["tests"]
    elif not outcome.get("ran") and (before.get("tests") or {}).get("ran"):
        outcome, tests_run = before["tests"], runs_before["tests"]
    kind = (
        "CPU DRY RUN (tiny model, few steps): checks the suite, measures nothing about the recipe"
        if dry_run
        else "measured"
    )
    tests_said = _tests_line(outcome) + ("" if tests_run is env else f" (from an earlier run: {_run_label(tests_run)})")
    header = [
        f"# {recipe}: A/B results ({kind})",
        "",
        "Written by `scripts/gpu_check.sh` (through `scripts/gpu_results.py`); do not edit by hand.",
        "",
        *[f"- {k}: {v}" for k, v in env.items()],
        "",
        "Each row is one `+bench=NAME` config (`configs/bench/`) on top of the recipe: `baseline` has every optimization off "
        "(fp32, no loader workers); the others switch one thing on; `all` switches everything on. A fixed number of steps per "
        "epoch; epoch 0 is warm-up and not counted; epoch_time_s is the median of the others. speedup is against `baseline` "
        "(from samples/s where batch sizes differ). The full reports (every flag column, spread, CSV) are in the sweep dirs.",
        "",
        ANCHORS,
        "",
        tests_said,
        "",
    ]
    if notes:
        header += ["## Notes on this run", "", *[f"- {note}" for note in notes], ""]
    path = out / "RESULTS.md"
    path.write_text("\n".join(header) + "\n" + "\n".join(sections))
    results = {
        "recipe": recipe,
        "dry_run": dry_run,
        "environment": env,
        "tests": outcome,
        "tests_run": tests_run,
        "notes": list(notes or []),
        "targets": TARGETS.get(recipe, {}),
        "jpeg_targets": across,
        "checks": checks,
        "checks_run": checks_run,
        "tables": tables,
        "table_runs": table_runs,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return path


def _part_runs(before: dict) -> dict:
    """Which run measured each part of an earlier results.json (pages written before these were kept
    per part: its tables under ``tables_from`` where it had one, else everything under its environment)."""
    env = before.get("environment") or {}
    tables_run = before.get("tables_from") or env
    checks = before.get("checks") or {}
    if isinstance(checks, list):  # a page written before the checks were kept by kind
        checks = {line.split(" (", 1)[0]: line for line in checks if line.startswith(("headline (", "ceiling ("))}
    return {
        "tables": {
            name: (before.get("table_runs") or {}).get(name) or tables_run for name in before.get("tables") or {}
        },
        "checks": {kind: (line, (before.get("checks_run") or {}).get(kind) or env) for kind, line in checks.items()},
        "tests": before.get("tests_run") or env,
    }


def _table_section(name: str, table: dict, out: Path, intro: str) -> str:
    parts = [f"## {name}", "", intro, ""]
    parts += [f"- {line}" for line in table.get("headline") or []] + [""]
    parts += [report.to_markdown(COLUMNS, table["rows"]), ""]
    if (out / f"{name}.png").exists():
        parts += [f"![{name}]({name}.png)", ""]
    parts += ["Command:", "", "```bash", table.get("command", "(not recorded)"), "```", ""]
    return "\n".join(parts)


def _run_label(env: Optional[Dict[str, str]]) -> str:
    env = env or {}
    return f"{env.get('date', '?')}, commit {env.get('commit', '?')}, {env.get('device', '?')}"


def _one_line(text: str) -> str:
    """A failure's message on one line (a traceback's lines would break the markdown around it)."""
    return " ".join(str(text).split())


def _tests_line(outcome: Dict[str, object]) -> str:
    if not outcome.get("ran"):
        return "GPU-marked tests: not run with this table."
    line = f"GPU-marked tests: {outcome['passed']} passed, {outcome['failed']} failed, {outcome['skipped']} skipped."
    failures = outcome.get("failures") or []
    return line + (
        ""
        if not failures
        else " Failed: " + "; ".join(f"`{f['test']}` ({_one_line(f['message'])[:160]})" for f in failures)
    )


def overhead_line(path: Path) -> str:
    """scripts/bench_overhead.py's result in one line: the framework's cost per epoch against a plain loop."""
    r = json.loads(path.read_text())
    st, lo_hi = r["settings"], r["ratio_interval_95"]
    return (
        f"overhead (ResNet-18, {st['image_size']} px, batch {st['batch_size']}, on {r['machine'].get('device', st.get('device'))}): "
        f"trainer/plain per epoch {r['median_ratio']:.3f} [{lo_hi[0]:.3f}-{lo_hi[1]:.3f}] over {st['repeats']} repeat(s): {r['conclusion']}"
    )


def headline_line(path: Path) -> str:
    """The README's first command, measured: images/s and data wait against the device-resident row."""
    m = json.loads(path.read_text())
    target = TARGETS["resnet50"]
    speed, wait = m.get("samples_per_s") or 0.0, m.get("data_wait_fraction")
    share = speed / target["device_resident_samples_per_s"]
    met = share >= target["headline_of_device_resident"] and wait is not None and wait < target["headline_data_wait"]
    return (
        f"headline (`python train.py +recipe=resnet50 amp=true compile=true`, {m.get('status')}): {speed:,.0f} images/s, "
        f"data wait {format_cell(wait)}, bottleneck {(m.get('diagnosis') or {}).get('verdict') or '-'}; "
        f"{share:.0%} of the device-resident row ({target['device_resident_samples_per_s']:,} images/s); "
        f"target 90% with under 5% data wait: {'met' if met else 'not met'}"
    )


def ceiling_line(path: Path) -> str:
    """scripts/bench_ceiling.py's result in one line: the trainer against a hand-written loop."""
    r = json.loads(path.read_text())
    st = r["settings"]
    return (
        f"ceiling ({st['model']}, {st['image_size']} px, batch {st['batch_size']}, {st['amp']}, channels_last, "
        f"compile, on {r['machine'].get('device')}): trainer/plain images/s {r['median_ratio']:.3f} "
        f"(min-max {r['ratio_min']:.3f}-{r['ratio_max']:.3f}, {st['repeats']} repeat(s)); plain "
        f"{r['plain_images_per_s']:,.0f}, trainer {r['trainer_images_per_s']:,.0f}; target {r['target_ratio']:.2f}: "
        f"{'met' if r['met'] else 'not met'}" + _per_step(r.get("per_step"))
    )


def _per_step(split: Optional[dict]) -> str:
    """bench_ceiling.py --long-batches: the trainer's cost per step and per epoch beside the plain loop's."""
    if not split:
        return ""
    short, long = split["steps_per_epoch"]
    return (
        f"; per step (from {short}- and {long}-step epochs) plain/trainer {split['per_step_median_ratio']:.3f} "
        f"({split['plain_step_ms']} vs {split['trainer_step_ms']} ms), fixed per epoch {split['plain_fixed_ms_per_epoch']} "
        f"vs {split['trainer_fixed_ms_per_epoch']} ms"
    )


def overlap_line(path: Path) -> str:
    """scripts/bench_nvjpeg_overlap.py's result in one line: each way's share of the step alone."""
    r = json.loads(path.read_text())
    ways = ", ".join(
        f"{row['way']} {row['of_compute']:.2f}"
        if row.get("of_compute") is not None
        else f"{row['way']} {'failed' if 'error' in row else 'not compared (no compute row)'}"
        for row in r["rows"]
    )
    alone = r.get("decode_alone_ms_by_library") or {"torchvision": r["decode_alone_ms"]}
    alone_text = ", ".join(f"{lib} {ms} ms" for lib, ms in alone.items())
    return (
        f"nvJPEG overlap (batch {r['settings']['batch']}, a {r['settings']['step_ms']:.0f} ms stand-in step, on "
        f"{r['machine']['device']}; decode alone: {alone_text}): share of the step alone: {ways}"
    )


def summary(paths: List[Path], tests_outcome: Optional[Dict[str, object]] = None) -> List[str]:
    """The check's summary: tests, and per recipe and table the best row, its speed-up, MFU, data wait,
    transfer and verdict, and the end-to-end targets across the JPEG tables."""
    lines = []
    loaded = [json.loads(p.read_text()) for p in paths if p.exists()]
    tests = next((r["tests"] for r in loaded if r["tests"].get("ran")), tests_outcome or {"ran": False})
    lines.append(_tests_line(tests))
    for r in loaded:
        for name, table in r["tables"].items():
            best = table.get("best")
            measured_by = (r.get("table_runs") or {}).get(name)
            earlier = (
                f" (from an earlier run: {_run_label(measured_by)})"
                if measured_by not in (None, r["environment"])
                else ""
            )
            if not best:
                lines.append(f"{r['recipe']} / {name}: no row finished{earlier}")
                continue
            mfu = (
                f"{best['mfu']:.1%}"
                if best.get("mfu") is not None
                else f"unknown ({best.get('peak_flops_source') or 'no peak'})"
            )
            lines.append(
                f"{r['recipe']} / {name}: best `{best['bench']}` {best['samples_per_s']:.0f} samples/s, "
                f"{format_cell(best['speedup'], 'speedup')} over baseline"
                + (f" [{best['speedup_ci']}]" if best.get("speedup_ci") else "")
                + f", MFU {mfu}, data wait {format_cell(best['data_wait_fraction'])}, transfer {format_cell(best['transfer_fraction'])}"
                + (f"; all on vs off {table['all_vs_baseline']:.2f}x" if table.get("all_vs_baseline") else "")
                + earlier
            )
            lines.append(f"  doctor ({best['bench']}): {best.get('verdict') or '-'}")
        lines += [f"{r['recipe']} / jpeg targets: {line}" for line in r.get("jpeg_targets") or []]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        lines.append(f"no results for: {', '.join(missing)}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe")
    p.add_argument("--sweeps", nargs="+", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--tests", type=Path, help="the GPU tests' JUnit XML")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--note", action="append", default=[], help="a note on the run, written under the header")
    p.add_argument(
        "--environment-from",
        type=Path,
        metavar="RESULTS_JSON",
        help="the environment (and the tests' outcome, unless --tests) of the machine the sweeps ran on",
    )
    p.add_argument(
        "--summary", nargs="*", type=Path, metavar="RESULTS_JSON", help="print the summary of these results.json files"
    )
    p.add_argument("--overhead", type=Path, help="with --summary: scripts/bench_overhead.py's result JSON")
    p.add_argument("--ceiling", type=Path, help="scripts/bench_ceiling.py's result JSON (the page, or --summary)")
    p.add_argument("--headline", type=Path, help="the headline run's metrics.json (the page, or --summary)")
    p.add_argument("--overlap", type=Path, help="with --summary: scripts/bench_nvjpeg_overlap.py's result JSON")
    args = p.parse_args(argv)
    if args.summary is not None:
        lines = summary(args.summary, test_outcome(args.tests) if args.tests else None)
        for path, line in (
            (args.headline, headline_line),
            (args.ceiling, ceiling_line),
            (args.overhead, overhead_line),
            (args.overlap, overlap_line),
        ):
            if path is not None:
                lines.append(line(path) if path.exists() else f"no result: {path}")
        print("\n".join(lines))
        return 0
    if not (args.recipe and args.out and (args.sweeps or args.headline or args.ceiling or args.tests)):
        p.error("--recipe and --out are needed, with --sweeps or a run's --tests, --headline, --ceiling (or --summary)")
    path = write(
        args.recipe, args.sweeps or [], args.out, args.dry_run, args.tests, args.note, args.environment_from,
        args.headline, args.ceiling,
    )  # fmt: skip
    print(f"wrote {path} and {path.parent / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
