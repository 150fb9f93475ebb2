"""The A/B report: one table of epoch times, speedups and accuracy, built from metrics.json files.

It reads every job's ``metrics.json`` from disk, so it works for any launcher (jobs in other
processes or machines) and for runs from different sweeps and days side by side:

    python -m trainer.report multirun/2026-11-22/10-00-00 [more dirs ...] [--out DIR]

After a sweep, ``trainer.sweep.SweepCallback`` (a Hydra callback, ``on_multirun_end``) calls
``write_report``: ``ab_report.md``, ``ab_report.csv`` and ``ab_report.png`` in the sweep dir, and the table printed.

The baseline row is the job with every varied key at its "off" value (the schema default), else
the first job. Jobs that differ only in ``seed``/``repeat`` (``repeats=N``, or a seed sweep) fold
into one row. Each speedup carries a bootstrap interval (``speedup_ci``); it is "within noise" when
the interval contains 1.00x. This module does not import torch.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import random
import statistics
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from trainer.measure import time_to_target as ttt
from trainer.measure.metrics import atomic_write_text

log = logging.getLogger(__name__)

ACC_DROP_THRESHOLD = 0.02  # absolute val_acc drop vs baseline that marks a row
# Noise is judged from the data: a speedup's 95% interval comes from a bootstrap of the ratio of
# median steady epoch times (resampling each job's epochs, and the repeats of a folded row); a
# speedup whose interval contains 1.00x is "within noise". Seeded, so a report rebuilds identically.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
# keys that say which repetition a job is (and how the repeats were made), not what it runs: jobs
# differing only in them fold into one row
REPEAT_KEYS = ("seed", "repeat", "repeat_seeds")
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
        """Times of the full, non-warm-up epochs (the ones epoch_time_s is the median of)."""
        epochs = self.metrics.get("epochs") or []
        return [e["time_s"] for e in epochs if not e.get("warmup") and not e.get("partial") and e.get("time_s")]


@dataclass
class Row:
    """One configuration: a job, or several repeats of it (same settings but seed/repeat)."""

    jobs: List[Job]
    name: str = ""

    @property
    def first(self) -> Job:
        return self.jobs[0]

    @property
    def ok(self) -> bool:
        return all(j.ok for j in self.jobs)

    @property
    def settings(self) -> Dict[str, Any]:
        return self.first.settings

    def seeds(self) -> int:
        """How many different seeds the row's runs trained with (a job given no seed= ran its config's)."""
        return len({json.dumps(j.settings.get("seed", _off_value("seed")), default=str) for j in self.jobs})

    def samples(self) -> List[List[float]]:
        """Steady epoch times per repeat (repeats with none left out)."""
        return [t for t in (j.steady_times() for j in self.jobs) if t]

    def epoch_time(self) -> Optional[float]:
        """The job's epoch_time_s; for repeats, the median of their pooled steady epochs (what speedup_ci resamples)."""
        if len(self.jobs) == 1:
            return self.first.metrics.get("epoch_time_s")
        pooled = [t for times in self.samples() for t in times]
        return round(statistics.median(pooled), 4) if pooled else None

    def median_of(self, key: str) -> Optional[float]:
        values = [j.metrics.get(key) for j in self.jobs if j.metrics.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    def val_samples(self) -> Optional[int]:
        """Validation samples behind the row's val_acc; None if a job did not record it. Repeats
        validate on the same samples and the row shows their median, so one job's count, not their sum."""
        counts = [j.metrics.get("val_samples") for j in self.jobs]
        return min(counts) if counts and all(counts) else None


def accuracy_noise(base_acc: float, base_n: Optional[int], acc: float, n: Optional[int]) -> Optional[float]:
    """Half-width of the 95% interval of a difference of two accuracies measured on n and base_n
    samples (normal approximation of two binomials): a smaller drop is within sampling noise."""
    if not base_n or not n:
        return None
    variance = base_acc * (1 - base_acc) / base_n + acc * (1 - acc) / n
    # an accuracy of exactly 0 or 1 still has the resolution of one sample
    variance = max(variance, 1 / base_n**2 + 1 / n**2)
    return 1.96 * math.sqrt(variance)


def find_metrics(dirs: Sequence[str]) -> List[Path]:
    """metrics.json files in the given run dirs or sweep dirs (any depth), in a stable order.

    A dir that holds a metrics.json is a run dir: nothing below it is searched, because what lies
    there is the run's own (W&B keeps a copy of metrics.json under ``wandb/*/files/``, one per
    attempt, which would otherwise be rows of their own)."""
    import os

    found: List[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_file() and p.name == "metrics.json":
            found.append(p)
            continue
        runs = []
        for root, subdirs, files in os.walk(p):
            if "metrics.json" in files:
                runs.append(Path(root) / "metrics.json")
                subdirs[:] = []  # the run's own files
        found.extend(sorted(runs, key=lambda q: _natural_key(q.relative_to(p))))
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

        from trainer.config import SCHEMA_KEYS, TrainSchema

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


def fold_repeats(jobs: List[Job], varied: List[str]) -> List[Row]:
    """Finished jobs whose settings differ only in seed/repeat share a row; any other job is a row of its own."""
    rows: List[Row] = []
    by_key: Dict[str, Row] = {}
    several_sweeps = len({j.path.resolve().parent for j in jobs}) > 1
    repeat_keys = [k for k in varied if k in REPEAT_KEYS]
    for job in jobs:
        if not job.ok or not repeat_keys:
            rows.append(Row([job]))
            continue
        # same settings from two sweeps (two days, before/after a change) are a comparison, not repeats
        where = str(job.path.resolve().parent) if several_sweeps else ""
        key = json.dumps(
            [where, {k: job.settings.get(k, _off_value(k)) for k in varied if k not in REPEAT_KEYS}],
            sort_keys=True,
            default=str,
        )
        which = [job.settings.get(k) for k in repeat_keys]
        row = by_key.get(key)
        if row is not None and all([j.settings.get(k) for k in repeat_keys] != which for j in row.jobs):
            row.jobs.append(job)
        else:
            by_key[key] = Row([job])
            rows.append(by_key[key])
    names = job_names(jobs)
    for row in rows:
        row.name = ",".join(names[id(j)] for j in row.jobs)
    return rows


def job_names(jobs: List[Job]) -> Dict[int, str]:
    """Unique, short names: the job number within one sweep; sweep dir + job when jobs come from several."""
    paths = [j.path.resolve() for j in jobs]
    parents = {p.parent for p in paths}
    if len(parents) == 1 and len(set(paths)) == len(paths):
        return {id(j): (p.name if p.name.isdigit() else str(j.path)) for j, p in zip(jobs, paths)}
    common = Path(os.path.commonpath([str(p) for p in paths])) if paths else Path(".")
    return {id(j): str(p.relative_to(common)) if p != common else p.name for j, p in zip(jobs, paths)}


def pick_baseline(rows: List[Row], varied: List[str]) -> Optional[Row]:
    """The first row with every varied key at its off value (keys without one are ignored), else the first ok row."""
    known = [k for k in varied if _off_value(k) is not None and k not in REPEAT_KEYS]
    for row in rows:
        if row.ok and all(row.settings.get(k, _off_value(k)) == _off_value(k) for k in known):
            return row
    return next((r for r in rows if r.ok), None)


def speedup_interval(
    base: List[List[float]], other: List[List[float]], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> Optional[tuple]:
    """A bootstrap interval of median(base) / median(other) over steady epoch times.

    Each argument is a list of repeats, each a list of epoch times. A resample draws repeats with
    replacement, then epochs within each drawn repeat, and pools them (a hierarchical bootstrap:
    run-to-run variation counts, not only epoch-to-epoch). None when either side has fewer than
    two epochs in all: one number has no spread to judge.
    """
    if sum(len(r) for r in base) < 2 or sum(len(r) for r in other) < 2:
        return None
    rng = random.Random(seed)

    def draw(repeats: List[List[float]]) -> float:
        picked = rng.choices(repeats, k=len(repeats)) if len(repeats) > 1 else repeats
        pooled = [t for r in picked for t in rng.choices(r, k=len(r))]
        return statistics.median(pooled)

    ratios = sorted(draw(base) / draw(other) for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(round((1 - tail) * (resamples - 1)))]


# decimals per numeric column in the markdown table (the CSV keeps full precision)
_DIGITS = {
    "epoch_time_s": 3,
    "speedup": 2,
    "samples_per_s": 1,
    "data_wait_fraction": 3,
    "transfer_fraction": 3,
    "peak_memory_mb": 0,
    "val_acc": 3,
    "tflops": 3,
    "mfu": 3,
    "time_to_target_s": 2,
    "time_to_target_speedup": 2,
    "epochs_to_target": 2,
    "val_share": 3,
}


def _fmt(value: Any, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if column in ("speedup", "time_to_target_speedup"):
            return f"{value:.2f}x"
        return f"{value:.{_DIGITS.get(column, 3)}f}"
    return str(value)


def build_rows(
    jobs: List[Job],
    acc_drop: float = ACC_DROP_THRESHOLD,
    target_acc: Any = ttt.AUTO,
    tolerance: float = ttt.DEFAULT_TOLERANCE,
) -> tuple:
    """Return (columns, rows as dicts, baseline Row); with the time-to-target columns where a target resolves."""
    # why longer: one row of the table per loop turn, each column next to the notes that qualify it
    # (a changed epoch size, an accuracy drop, a failed job); split, the notes would lose their column
    varied = varied_keys(jobs)
    rows = fold_repeats(jobs, varied)
    base = pick_baseline(rows, varied)
    shown = [k for k in varied if k not in REPEAT_KEYS]
    base_time = base.epoch_time() if base else None
    base_acc = base.median_of("val_acc") if base else None
    repeated = any(len(r.jobs) > 1 for r in rows)
    optional = [key for key in ("tflops", "mfu") if any(j.metrics.get(key) is not None for j in jobs)]
    columns = (
        ["job"]
        + shown
        + (["world_size"] if "world_size" not in shown else [])
        + (["repeats"] if repeated else [])
        + [
            "epoch_time_s",
            "spread_s",
            "speedup",
            "speedup_ci",
            "samples_per_s",
            "data_wait_fraction",
            "transfer_fraction",
            *optional,
            "peak_memory_mb",
            "val_acc",
            "bottleneck",
            "status",
            "notes",
        ]
    )
    out = []
    for row in rows:
        m = row.first.metrics
        notes: List[str] = []
        t = row.epoch_time()
        speedup = round(base_time / t, 3) if (row.ok and t and base_time) else None
        interval = (
            speedup_interval(base.samples(), row.samples()) if (speedup is not None and row is not base) else None
        )
        base_samples, samples = _epoch_samples(base.first) if base else None, _epoch_samples(row.first)
        if speedup is not None and base_samples and samples and samples != base_samples:
            # epochs of different sizes (a batch-size change with trainer.limit_train_batches as a
            # count): compare throughput, not epoch time (and scale the interval the same way)
            by_time = speedup
            speedup = round(row.median_of("samples_per_s") / base.median_of("samples_per_s"), 3)
            if interval:
                interval = (interval[0] * speedup / by_time, interval[1] * speedup / by_time)
            notes.append(f"epochs differ in size ({samples} vs {base_samples} samples): speedup from samples/s")
        if row is base:
            notes.append("baseline")
        elif speedup is not None:
            if interval is None:
                notes.append("noise not judged: fewer than 2 steady epochs")
            elif interval[0] <= 1.0 <= interval[1]:
                notes.append("within noise")
        if row.ok and not row.samples():
            notes.append("warm-up only: 1 epoch, not steady state")
        steps = [e.get("steps") for e in (m.get("epochs") or []) if e.get("steps")]
        if row.ok and steps and max(steps) < FEW_STEPS:
            notes.append(f"only {max(steps)} steps/epoch")
        acc = row.median_of("val_acc") if row.ok else m.get("val_acc")
        if row.ok and acc is not None and base_acc is not None and base_acc - acc > acc_drop:
            noise = accuracy_noise(base_acc, base.val_samples(), acc, row.val_samples())
            if noise is not None and base_acc - acc <= noise:
                notes.append(
                    f"val_acc {acc - base_acc:+.3f} not a significant drop (+-{noise:.3f} on {row.val_samples()} val samples)"
                )
            else:
                notes.append(f"ACCURACY DROP {acc - base_acc:+.3f}")
        if m.get("compile_time_s"):
            notes.append(f"compile {m['compile_time_s']:.1f} s")
        if not row.ok:
            notes.append(str(m.get("error") or m.get("status") or "failed"))
        spread = _spread(row)
        record = {"job": row.name}
        record.update({k: row.settings.get(k, _off_value(k)) for k in shown})
        record.setdefault("world_size", (m.get("device") or {}).get("count"))
        if repeated:
            record["repeats"] = len(row.jobs)
        record.update(
            epoch_time_s=t if row.ok else None,
            spread_s=f"{spread[0]:.3f}-{spread[1]:.3f}" if spread else None,
            speedup=speedup,
            speedup_ci=f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else None,
            samples_per_s=row.median_of("samples_per_s") if row.ok else None,
            data_wait_fraction=row.median_of("data_wait_fraction") if row.ok else None,
            transfer_fraction=row.median_of("transfer_fraction") if row.ok else None,
            peak_memory_mb=m.get("peak_memory_mb"),
            val_acc=acc,
            bottleneck=(m.get("diagnosis") or {}).get("bottleneck"),
            status=m.get("status", "failed"),
            notes="; ".join(notes),
        )
        if not row.ok:  # not a column (notes has it): the console's verdict names it alone
            record["error"] = str(m.get("error") or m.get("status") or "failed")
        for key in optional:
            record[key] = row.median_of(key) if row.ok else None
        out.append(record)
    _add_time_to_target(columns, rows, out, base, target(base, target_acc, tolerance)[0])
    return columns, out, base


TIME_TO_TARGET_COLUMNS = [
    "time_to_target_s",
    "epochs_to_target",
    "time_to_target_speedup",
    "time_to_target_ci",
    "time_to_target_ci_holds",
    "val_share",
]
# what a row's time_to_target_ci holds (time_to_target_ci_holds): the variation of the seeds (the row
# and the baseline each ran several), timing noise only (runs of one seed learn alike: they reach the
# target in the same epoch), or nothing: a single run on either side has no interval, its ratio not judged
SEEDS, TIMING_ONLY, NOT_JUDGED = "seeds", "timing only", "not judged"
# how to get a judged row in one command (said where a row's ratio is not judged across seeds)
SEEDED_REPEATS = "repeats=N repeat_seeds=true"


def target(base: Optional[Row], target_acc: Any, tolerance: float) -> tuple:
    """(the target val_acc or None, how it was chosen): ``report.target_acc`` against this baseline."""
    runs = [j.metrics.get("epochs") or [] for j in base.jobs] if base else []
    return ttt.resolve_target(target_acc, runs, tolerance)


def _add_time_to_target(columns: List[str], rows: List[Row], out: List[dict], base: Optional[Row], goal) -> None:
    """Each row's time to ``goal`` beside its val_acc (nothing when there is no target)."""
    if goal is None or base is None:
        return
    at = columns.index("val_acc") + 1
    columns[at:at] = TIME_TO_TARGET_COLUMNS
    base_runs = [j.metrics.get("epochs") or [] for j in base.jobs]
    for row, record in zip(rows, out):
        if not row.ok:
            record.update(dict.fromkeys(TIME_TO_TARGET_COLUMNS))
            continue
        found = ttt.row_columns(base_runs, [j.metrics.get("epochs") or [] for j in row.jobs], goal, row is base)
        notes = [found.pop("note")]
        record.update(found)
        shares = [s for s in (val_share(j.metrics.get("epochs") or []) for j in row.jobs) if s is not None]
        record["val_share"] = round(statistics.median(shares), 4) if shares else None
        ci = found["time_to_target_ci"]
        record["time_to_target_ci_holds"] = holds = ci_holds(base, row, found["time_to_target_speedup"], ci)
        if ci and float(ci.split("-")[0]) <= 1.0 <= float(ci.split("-")[1]):
            notes.append("time to target within noise")
        if holds == TIMING_ONLY:
            notes.append(
                "time to target judged on one seed: its interval holds timing noise only "
                f"({SEEDED_REPEATS} gives each repeat its own seed)"
            )
        elif holds == NOT_JUDGED:
            notes.append(f"time to target not judged: one run has no interval ({SEEDED_REPEATS} judges it)")
        record["notes"] = "; ".join(n for n in (record["notes"], *notes) if n)


def val_share(epochs: List[dict]) -> Optional[float]:
    """Validation's share of a run's training plus validation time: what validating during training
    (``report.val_per_epoch`` more so) costs beside the time to target, which leaves it out."""
    if not any("val_time_s" in e for e in epochs):
        return None  # not recorded (a journal older than the column)
    last = ttt.with_elapsed(sorted(epochs, key=lambda e: e.get("epoch", 0)))[-1]  # time to target's own clock
    train, val = last["elapsed_train_s"], last["elapsed_val_s"]
    return val / (train + val) if train + val > 0 else None


def ci_holds(base: Row, row: Row, speedup: Optional[float], ci: Optional[str]) -> Optional[str]:
    """What a row's time-to-target interval holds: SEEDS, TIMING_ONLY, NOT_JUDGED (a ratio without an
    interval), or None where there is no ratio to judge (the baseline, a row that missed the target)."""
    if row is base or speedup is None:
        return None
    if not ci:
        return NOT_JUDGED
    return SEEDS if base.seeds() > 1 and row.seeds() > 1 else TIMING_ONLY


def _epoch_samples(job: Job) -> Optional[int]:
    epochs = [e for e in job.metrics.get("epochs") or [] if not e.get("partial")]
    return epochs[-1].get("samples") if epochs else None


def _spread(row: Row) -> Optional[tuple]:
    """min-max of the steady epochs (one job), or of the repeats' medians (a folded row)."""
    if len(row.jobs) > 1:
        medians = [statistics.median(t) for t in row.samples()]
        return (min(medians), max(medians)) if len(medians) >= 2 else None
    times = row.first.steady_times()
    return (min(times), max(times)) if len(times) >= 2 else None


def to_markdown(columns: List[str], rows: List[dict]) -> str:
    out = io.StringIO()
    out.write("| " + " | ".join(columns) + " |\n")
    out.write("|" + "|".join(" --- " for _ in columns) + "|\n")
    for row in rows:
        cells = [_fmt(row.get(c), c) for c in columns]
        if row.get("time_to_target_ci_holds") == NOT_JUDGED and "time_to_target_speedup" in columns:
            from trainer.output.console import one_run  # a ratio without an interval: not judged, and marked so

            cells[columns.index("time_to_target_speedup")] += " " + one_run(row)
        out.write("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |\n")
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


def shown_keys(columns: List[str], rows: List[dict]) -> List[str]:
    """The settings that tell the rows apart (the chart's labels, the console's configuration)."""
    return [
        c
        for c in columns[1 : columns.index("epoch_time_s")]
        if c != "repeats" and (c != "world_size" or len({r.get(c) for r in rows}) > 1)
    ]


def chart(jobs: List[Job], columns: List[str], rows: List[dict], goal: Optional[float] = None):
    """The figure of ``ab_report.png``: horizontal bars of epoch time per configuration, the speedup
    written on each bar; with a target (``goal``) a second panel of val_acc against training time,
    one line per row (the row's first job), the target dashed. Returned rather than saved so that
    what it shows can be read back from its data (``save_png`` writes it)."""
    from matplotlib.figure import Figure

    curves = None
    if goal is not None:
        folded = fold_repeats(jobs, varied_keys(jobs))  # the rows of build_rows, in the same order
        curves = [ttt.curve(row.first.metrics.get("epochs") or []) for row in folded]

    varied = shown_keys(columns, rows)
    labels = [_label(r, varied) for r in rows]
    times = [r["epoch_time_s"] or 0.0 for r in rows]
    lines = sum(max(1, label.count("\n") + 1) for label in labels)
    height = 0.32 * lines + 0.25 * len(rows) + 1.6
    with_curves = bool(curves) and any(curves)
    # a Figure of its own, not pyplot's: no process-wide figure registry or backend to set
    if with_curves:
        fig = Figure(figsize=(11, height + 4.2))
        ax, curve_ax = fig.subplots(2, 1, gridspec_kw={"height_ratios": [height, 4.2]})
    else:
        fig = Figure(figsize=(11, height))
        ax = fig.subplots()
    ypos = range(len(rows))
    colors = [
        "#9e9e9e" if "baseline" in r["notes"] else ("#d9534f" if r["status"] != "ok" else "#4c72b0") for r in rows
    ]
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
            text = (
                f"{t:.3g} s   {r['speedup']:.2f}x"
                + (f" [{r['speedup_ci']}]" if r.get("speedup_ci") else "")
                + (" (noise)" if "within noise" in r["notes"] else "")
            )
        else:
            text = f"{t:.3g} s"
        ax.text(t + errors[1][y] + top * 0.015, y, text, va="center", fontsize=9)
    ax.set_yticks(list(ypos))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel("epoch time (s), median of steady epochs; lower is better")
    ax.set_title("A/B: epoch time and speedup vs baseline (grey)")
    if with_curves:
        _accuracy_curves(curve_ax, rows, labels, curves, goal)
    fig.tight_layout()
    return fig


def save_png(path: Path, figure) -> None:
    figure.savefig(path, dpi=110)


def _accuracy_curves(ax, rows: List[dict], labels: List[str], curves: List[list], goal) -> None:
    """val_acc against training time (validation time apart), one line per row; the target dashed."""
    for i, (row, label, points) in enumerate(zip(rows, labels, curves)):
        if points:
            xs, ys = zip(*points)
            style = {"color": "#9e9e9e", "linewidth": 2.5} if "baseline" in row["notes"] else {"color": f"C{i % 10}"}
            ax.plot(xs, ys, marker="o", markersize=3, label=label.replace("\n", " ")[:60], **style)
    if goal is not None:
        ax.axhline(goal, color="#333333", linestyle="--", linewidth=1, label=f"target {goal:.3f}")
    ax.set_xlabel("training time so far (s), validation time apart")
    ax.set_ylabel("val_acc")
    ax.set_title("time to accuracy: val_acc after each epoch")
    ax.legend(fontsize=7, loc="lower right")


def _header(jobs: List[Job], base: Optional[Row], how: str) -> str:
    """The report's first paragraph: what ran, the baseline, and how every column is judged."""
    device = next((j.metrics.get("device") for j in jobs if j.metrics.get("device")), None) or {}
    return (
        f"# A/B report\n\n{len(jobs)} job(s) on {device.get('accelerator', '?')} ({device.get('name', '?')}). "
        f"Baseline: job {base.name if base else '-'}. epoch_time_s is the median of the steady (non-warm-up, full) epochs; "
        f"spread_s is their min-max (for a row of repeats: the min-max of the repeats' medians). "
        f"Noise: speedup_ci is a {CONFIDENCE:.0%} bootstrap interval of the ratio of median epoch times "
        f"({BOOTSTRAP_RESAMPLES} resamples of each job's steady epochs, and of the repeats where a row folds several); "
        f"a speedup whose interval contains 1.00x is marked 'within noise'. "
        f"Jobs that differ only in seed/repeat are folded into one row. "
        f"data_wait_fraction is time blocked on the data loader; transfer_fraction is batch-to-device plus device-side decode/normalize. "
        f"Rows whose val_acc fell more than {ACC_DROP_THRESHOLD} below the baseline are marked ACCURACY DROP, unless the "
        f"drop is within the sampling noise of the validation set (a 95% interval for the difference of two accuracies, "
        f"from the number of val samples each job saw): then the note says 'not a significant drop'. "
        f"Time to accuracy: {how}; time_to_target_s is the training time (validation apart, warm-up and compile "
        f"included) until the first epoch whose val_acc reaches it, epochs_to_target that epoch's count, "
        f"time_to_target_speedup the baseline's time over the row's (time_to_target_ci: a bootstrap over repeats; "
        f"none without repeats). time_to_target_ci_holds says what that interval holds: '{SEEDS}' where the row and "
        f"the baseline each ran several seeds (a seed sweep, or {SEEDED_REPEATS}), '{TIMING_ONLY}' where one side's "
        f"runs share one seed (they learn alike, so the seeds' say in how many epochs it takes is not in it), "
        f"'{NOT_JUDGED}' where a single run leaves no interval. val_share is validation's share of the run's "
        f"training plus validation time (what it costs to watch the accuracy; time to target leaves it out). "
        f"A row faster per epoch can be slower to the target.\n\n"
    )


def write_report(
    dirs: Sequence[str],
    out_dir: str,
    echo: bool = True,
    not_run: Sequence[str] = (),
    note: str = "",
    target_acc: Any = ttt.AUTO,
    tolerance: float = ttt.DEFAULT_TOLERANCE,
) -> Optional[str]:
    """Build the report from ``dirs`` into ``out_dir``; return the markdown (None if no jobs).

    ``not_run``: jobs of a stopped sweep that never ran (listed under the table), ``note``: why.
    ``target_acc``, ``tolerance``: ``report.target_acc`` and ``report.target_tolerance``."""
    jobs = load_jobs(dirs)
    out = Path(out_dir)
    if not jobs:
        log.warning("no metrics.json found under %s: no report written", ", ".join(map(str, dirs)))
        return None
    columns, rows, base = build_rows(jobs, target_acc=target_acc, tolerance=tolerance)
    goal, how = target(base, target_acc, tolerance)
    header = _header(jobs, base, how)
    missing = ""
    if not_run:
        missing = f"\n**Not run** ({note or 'the sweep stopped early'}): " + "; ".join(not_run) + "\n"
    markdown = header + to_markdown(columns, rows) + missing
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "ab_report.md", markdown)
    atomic_write_text(out / "ab_report.csv", to_csv(columns, rows))
    try:
        save_png(out / "ab_report.png", chart(jobs, columns, rows, goal))
    except Exception as e:  # the chart is a convenience; the table is the product
        log.warning("could not draw ab_report.png: %s", e)
    if echo:
        from trainer.output.console import TABLE_WIDTH, ab_table

        verdicts = verdict_lines(jobs)
        base_job = base.name if base else None
        said = "".join("\n" + textwrap.fill(line, TABLE_WIDTH) for line in judgement_notes(rows, base_job))
        print(
            "\n"
            + ab_table(rows, shown_keys(columns, rows), base_job)
            + (said + "\n" if said else "")
            + missing
            + ("\n" + "\n".join(verdicts) + "\n" if verdicts else "")
            + f"\nreport: {out / 'ab_report.md'} (table), {out / 'ab_report.csv'}, chart: {out / 'ab_report.png'}\n",
            flush=True,
        )
    return markdown


def judgement_notes(rows: List[dict], base_job: Optional[str]) -> List[str]:
    """What the console table's marks mean, said under it where a row carries one."""

    def named(holds: str) -> List[str]:
        return [r["job"] for r in rows if r.get("time_to_target_ci_holds") == holds]

    out = []
    unjudged = [
        r["job"] for r in rows if r["job"] != base_job and r.get("speedup") is not None and not r.get("speedup_ci")
    ]
    if unjudged:
        out.append(
            f"speed-up (not judged), job(s) {', '.join(unjudged)}: fewer than 2 steady epochs on a side, "
            "so no interval; train more epochs."
        )
    if named(NOT_JUDGED):
        out.append(
            f"speed-up to target (1 run), job(s) {', '.join(named(NOT_JUDGED))}: not judged, a single run (of the row "
            f"or of the baseline) has no interval; {SEEDED_REPEATS} runs each configuration N times, each with its "
            "own seed, and judges it."
        )
    if named(TIMING_ONLY):
        out.append(
            f"speed-up to target, job(s) {', '.join(named(TIMING_ONLY))}: judged on one seed, so the interval holds "
            "timing noise only, not the seeds' say in how many epochs the target takes; "
            f"{SEEDED_REPEATS} gives each repeat its own seed."
        )
    return out


def verdict_lines(jobs: List[Job]) -> List[str]:
    """The doctor's verdict per job, jobs with the same verdict on one line."""
    by_verdict: Dict[str, List[str]] = {}
    for row in fold_repeats(jobs, varied_keys(jobs)):
        verdict = (row.first.metrics.get("diagnosis") or {}).get("verdict")
        if verdict:
            by_verdict.setdefault(verdict, []).append(row.name)
    return [
        f"doctor, job{'s' if len(names) > 1 else ''} {', '.join(names)}: {verdict}"
        for verdict, names in by_verdict.items()
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.report", description="Rebuild the A/B report from sweep or run dirs."
    )
    parser.add_argument("dirs", nargs="+", help="sweep dirs, run dirs or metrics.json files")
    parser.add_argument(
        "--out", help="where to write ab_report.* (default: the single dir given, else the current dir)"
    )
    parser.add_argument(
        "--target-acc",
        default=ttt.AUTO,
        help="val_acc for the time-to-target columns: a number, auto (the baseline's best minus the tolerance) or off",
    )
    parser.add_argument("--target-tolerance", type=float, default=ttt.DEFAULT_TOLERANCE, help="auto's margin (0.01)")
    args = parser.parse_args(argv)
    if args.target_acc not in (ttt.AUTO, "off"):
        try:
            value = float(args.target_acc)
        except ValueError:
            value = math.nan
        if not 0 < value <= 1:  # the range report.target_acc allows (NaN fails it too)
            print(
                f"error: --target-acc {args.target_acc!r}: allowed are auto, off or a number in (0, 1]", file=sys.stderr
            )
            return 2
        args.target_acc = value
    if not 0 <= args.target_tolerance < 1:
        print(f"error: --target-tolerance {args.target_tolerance:g}: allowed is a number in [0, 1)", file=sys.stderr)
        return 2
    missing = [d for d in args.dirs if not os.path.exists(d)]
    if missing:
        print(f"error: no such dir: {', '.join(missing)}", file=sys.stderr)
        return 2
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 and os.path.isdir(args.dirs[0]) else ".")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    written = write_report(args.dirs, out, target_acc=args.target_acc, tolerance=args.target_tolerance)
    return 0 if written is not None else 1


if __name__ == "__main__":
    sys.exit(main())
