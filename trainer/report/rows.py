"""The report's table as data: one dict per row (``build_rows``), with the time-to-target columns.

Each row's numbers sit next to the notes that qualify them (a changed epoch size, an accuracy
drop, a failed job, a ratio not judged), so the markdown, the CSV, the console table and the chart
all show the same judgement. The target and the time-to-target columns (``target``,
``TIME_TO_TARGET_COLUMNS``, ``ci_holds``, ``val_share``) are here because they are columns of the
same rows; ``trainer.measure.time_to_target`` measures them.
"""

from __future__ import annotations

import collections
import statistics
from typing import Any, List, Optional

from trainer.measure import time_to_target as ttt
from trainer.report.jobs import REPEAT_KEYS, Job, Row, fold_repeats, pick_baseline, varied_keys
from trainer.report.noise import accuracy_noise, speedup_interval, spread_of

ACC_DROP_THRESHOLD = 0.02  # absolute val_acc drop vs baseline that marks a row
FEW_STEPS = 10  # fewer steps per epoch than this: timing is dominated by per-epoch overheads


def build_rows(
    jobs: List[Job],
    acc_drop: float = ACC_DROP_THRESHOLD,
    target_acc: Any = ttt.AUTO,
    tolerance: float = ttt.DEFAULT_TOLERANCE,
) -> tuple:
    """Return (columns, rows as dicts, baseline Row); with the time-to-target columns where a target resolves."""
    varied = varied_keys(jobs)
    rows = fold_repeats(jobs, varied)
    base = pick_baseline(rows, varied)
    shown = [k for k in varied if k not in REPEAT_KEYS]
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
    out = [_record(row, base, shown, repeated, optional, acc_drop) for row in rows]
    _add_time_to_target(columns, rows, out, base, target(base, target_acc, tolerance)[0])
    return columns, out, base


def _record(row: Row, base: Optional[Row], shown: List[str], repeated: bool, optional: List[str], acc_drop: float):
    """One row of the table: its columns, and the notes that qualify them, in the order they are read."""
    m = row.first.metrics
    t = row.epoch_time()
    speedup, interval, notes = _speedup(row, base)
    if row.ok and not row.samples():
        notes.append("warm-up only: 1 epoch, not steady state")
    steps = [e.get("steps") for e in (m.get("epochs") or []) if e.get("steps")]
    if row.ok and steps and max(steps) < FEW_STEPS:
        notes.append(f"only {max(steps)} steps/epoch")
    acc = row.median_of("val_acc") if row.ok else m.get("val_acc")
    base_acc = base.median_of("val_acc") if base else None
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
    bottleneck = folded_bottleneck(row, notes)  # (it notes where the repeats' verdicts differ)
    spread = spread_of(row)
    record = {"job": row.name}
    record.update({k: row.value(k) for k in shown})
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
        bottleneck=bottleneck,
        status=m.get("status", "failed"),
        notes="; ".join(notes),
    )
    if not row.ok:  # not a column (notes has it): the console's verdict names it alone
        record["error"] = str(m.get("error") or m.get("status") or "failed")
    for key in optional:
        record[key] = row.median_of(key) if row.ok else None
    return record


def _speedup(row: Row, base: Optional[Row]) -> tuple:
    """(speed-up over the baseline, its interval, the notes that qualify it) for one row."""
    notes: List[str] = []
    t = row.epoch_time()
    base_time = base.epoch_time() if base else None
    # steady epochs are compared with steady epochs only: a side with nothing but its warm-up epoch
    # (compile, workers starting) beside one with steady epochs would bias the ratio, not just widen it
    warm_up_only = base is not None and row.ok and row is not base and bool(row.samples()) != bool(base.samples())
    speedup = round(base_time / t, 3) if (row.ok and t and base_time and not warm_up_only) else None
    interval = speedup_interval(base.samples(), row.samples()) if (speedup is not None and row is not base) else None
    base_samples, samples = _epoch_samples(base.first) if base else None, _epoch_samples(row.first)
    if speedup is not None and base_samples and samples and samples != base_samples:
        # epochs of different sizes (a batch-size change with trainer.limit_train_batches as a
        # count): compare throughput, not epoch time (and scale the interval the same way)
        by_time = speedup
        speedup = round(row.median_of("samples_per_s") / base.median_of("samples_per_s"), 3)
        if interval:
            interval = (interval[0] * speedup / by_time, interval[1] * speedup / by_time)
        notes.append(f"epochs differ in size ({samples} vs {base_samples} samples): speedup from samples/s")
    if interval:  # judged as written: md, csv and the console read the same three decimals
        interval = (round(interval[0], 3), round(interval[1], 3))
    if row is base:
        notes.append("baseline")
    elif warm_up_only:
        short = row if not row.samples() else base
        why = f" ({STOPPED_AT_TARGET})" if _stopped_at_target(short) else ""
        notes.append(f"{NO_SPEEDUP}: {_side(short, row)} ran only its warm-up epoch{why}")
    elif row.ok and speedup is None:
        short = row if not t else base
        why = f" ({STOPPED_AT_TARGET})" if _stopped_at_target(short) else ""
        notes.append(f"{NO_SPEEDUP}: {_side(short, row)} has no steady epoch time{why}")
    elif speedup is not None:
        if interval is None:
            short = next(
                (side for side in (row, base) if _stopped_at_target(side) and sum(map(len, side.samples())) < 2), None
            )
            why = f" ({_side(short, row)}: {STOPPED_AT_TARGET})" if short else ""
            notes.append(f"noise not judged: fewer than 2 steady epochs{why}")
        elif interval[0] <= 1.0 <= interval[1]:
            notes.append("within noise")
    return speedup, interval, notes


def _side(short: Row, row: Row) -> str:
    return "this row" if short is row else "the baseline"


def _stopped_at_target(row: Optional[Row]) -> bool:
    """Whether ``stop_at_acc`` ended a run of the row (metrics.json's ``stopped_at_acc_epoch``): its
    target, not ``trainer.max_epochs``, decided how many epochs it trained, so "train more epochs" is
    no advice for it (the notes say STOPPED_AT_TARGET, and ``render.judgement_notes`` advises so)."""
    return row is not None and any(j.metrics.get("stopped_at_acc_epoch") is not None for j in row.jobs)


# a row whose epoch time has no ratio to the baseline's (the note says why)
NO_SPEEDUP = "no speed-up"
# said where a side of a ratio has too few steady epochs because stop_at_acc ended its run
STOPPED_AT_TARGET = "stop_at_acc stopped it at its target"

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
    """(the target val_acc or None, how it was chosen): ``report.target_acc`` against this baseline
    (None where it is no target at all: 0 or below, which every row reaches before training)."""
    runs = [j.metrics.get("epochs") or [] for j in base.jobs] if base else []
    return ttt.usable_target(target_acc, runs, tolerance)


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


def folded_bottleneck(row: Row, notes: List[str]) -> Optional[str]:
    """The doctor's verdict for the row: the one most of its repeats got (``notes`` says when they
    differ), not the first repeat's alone, which could read "compute" beside the repeats' median data
    wait above the input-bound line; "mixed" where no verdict has a majority."""
    found = [(j.metrics.get("diagnosis") or {}).get("bottleneck") for j in row.jobs]
    # the repeats that measured a bottleneck: one without a diagnosis (an older record) or "unknown"
    # (no whole epoch timed) has no say, unless none measured one
    known = [b for b in found if b and b != "unknown"] or [b for b in found if b]
    counts = collections.Counter(known)
    if not counts:
        return None
    if len(counts) > 1:
        notes.append("bottleneck differs across repeats: " + ", ".join(f"{b} {n}" for b, n in counts.most_common()))
    verdict, n = counts.most_common(1)[0]
    return verdict if 2 * n > len(known) else "mixed"


def _epoch_samples(job: Job) -> Optional[int]:
    epochs = [e for e in job.metrics.get("epochs") or [] if not e.get("partial")]
    return epochs[-1].get("samples") if epochs else None
