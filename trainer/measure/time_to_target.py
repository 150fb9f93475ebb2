"""Time to accuracy: how soon each configuration reaches a target validation accuracy.

Epoch time with the final accuracy beside it hides a speed-up that makes each epoch faster but
needs more of them (a larger batch, low resolution, fp16 without loss-scale headroom). MLPerf
ranks by time to a target, FFCV and Composer publish time-to-accuracy tables; the journal already
records every epoch, so the report can say the same for the user's own model:

- ``with_elapsed`` gives each epoch record (metrics.json) the training and validation time since
  the run started (``elapsed_train_s``, ``elapsed_val_s``), resumes included: a partial epoch (a
  resume that started mid-epoch only timed its tail) counts as a full epoch of the run's median
  step time, and says so (``elapsed_estimated``);
- ``reach`` finds the first validation whose ``val_acc`` reaches the target: ``time_to_target_s`` is
  the training time up to it, ``epochs_to_target`` the epochs trained by then (a fraction of an epoch
  with ``report.val_per_epoch``, which validates several times per epoch; each validation is
  recorded with the training time it began at). Training time, the same for every
  row: each epoch's time (the clock of the epoch times: its steps, its compiling steps, its
  loader's start), plus what each process paid from the start of ``fit`` to its first epoch
  (``setup_s``: the compiler's warm-up, a checkpoint's restore, the sanity check's validation and
  compile, the first loader iterator's workers), plus what compiling cost the validations
  (``val_compile_s``: a compiled run's first validation compiles its evaluation graph, seconds on
  a GPU, before that validation's accuracy is known; left with validation it would make compile
  rows look cheaper than they are). Not counted: the rest of validation during training (kept
  apart, ``elapsed_val_s``), and what comes before ``fit`` (reading or copying the data, building
  the model, the batch-size search), which no switch of a row changes the way it changes these;
- ``resolve_target`` turns ``report.target_acc`` (a number, or ``auto``: the baseline's best
  val_acc minus ``report.target_tolerance``) into the number, with the sentence that says how;
  ``usable_target`` is the report's: no target (and why) where auto's lands at 0 or below;
- ``speedup_interval`` bootstraps the ratio of median times over repeats (one number per job: a
  row without repeats has no interval).
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

AUTO = "auto"
DEFAULT_TOLERANCE = 0.01
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def with_elapsed(epochs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The epoch records (in epoch order) with cumulative training and validation time added."""
    full_steps = [e["time_s"] / e["steps"] for e in epochs if not e.get("partial") and e.get("steps")]
    step_time = statistics.median(full_steps) if full_steps else None
    full_counts = [e["steps"] for e in epochs if not e.get("partial") and e.get("steps")]
    steps_per_epoch = max(full_counts) if full_counts else None
    train = val = 0.0
    out = []
    for epoch in epochs:
        record = dict(epoch)
        time_s = epoch.get("time_s") or 0.0
        if epoch.get("resumed") and step_time and steps_per_epoch and epoch.get("steps", 0) < steps_per_epoch:
            # the steps before the resume ran in a process that was killed before the epoch ended
            time_s = max(time_s, step_time * steps_per_epoch)
            record["elapsed_estimated"] = True
        start = train + (epoch.get("setup_s") or 0.0)
        val_compile = epoch.get("val_compile_s") or 0.0  # moved from validation's time to training's
        if epoch.get("validations"):
            # validated within the epoch (report.val_per_epoch): each at the training time it began,
            # plus what compiling cost this and the epoch's earlier validations; steps an estimated
            # epoch ran before its resume came first
            before = time_s - (epoch.get("time_s") or 0.0)
            paid, record["validations"] = 0.0, []
            for v in epoch["validations"]:
                paid += v.get("compile_s") or 0.0
                record["validations"].append(dict(v, elapsed_train_s=round(start + before + v["train_s"] + paid, 4)))
        train = start + time_s + val_compile
        val += max(0.0, (epoch.get("val_time_s") or 0.0) - val_compile)
        record["elapsed_train_s"] = round(train, 4)
        record["elapsed_val_s"] = round(val, 4)
        out.append(record)
    return out


def validations(epochs: List[Dict[str, Any]]) -> List[Tuple[float, float, float]]:
    """(training time so far, epochs so far, val_acc) at every validation that logged an accuracy, in
    order: several per epoch with ``report.val_per_epoch``, else one at each validated epoch's end."""
    timed = epochs if epochs and "elapsed_train_s" in epochs[0] else with_elapsed(epochs)
    points = []
    for epoch in sorted(timed, key=lambda e: e["epoch"]):
        within = epoch.get("validations")
        if within:
            for v in within:
                if v.get("val_acc") is not None:
                    done = v["fraction"] if v.get("fraction") is not None else 1.0
                    points.append((v["elapsed_train_s"], round(epoch["epoch"] + done, 4), v["val_acc"]))
        elif epoch.get("val_acc") is not None:
            points.append((epoch["elapsed_train_s"], epoch["epoch"] + 1, epoch["val_acc"]))
    return points


def curve(epochs: List[Dict[str, Any]]) -> List[Tuple[float, float]]:
    """(training time so far, val_acc) at each validation (``validations``)."""
    return [(t, acc) for t, _, acc in validations(epochs)]


def reaches(val_acc: Optional[float], target: float) -> bool:
    """Whether a val_acc (as metrics.json records it) reaches ``target``: the one comparison that the
    report, the tuner and ``stop_at_acc`` share, so that an epoch counted as reaching the target is
    also the one that stops a run. Reaching includes meeting it exactly (accuracies are k/N, targets
    round numbers)."""
    return val_acc is not None and val_acc >= target - 1e-12


def reach(epochs: List[Dict[str, Any]], target: float) -> Optional[Tuple[float, float]]:
    """(time_to_target_s, epochs_to_target) at the first validation whose val_acc reaches ``target``;
    None if none does. With validations within epochs (``report.val_per_epoch``) both are fractions
    of an epoch's worth (2.25: a quarter into the third epoch); else whole epochs."""
    return _first_reaching(validations(sorted(epochs, key=lambda e: e["epoch"])), target)


def _first_reaching(points: List[Tuple[float, float, float]], target: float) -> Optional[Tuple[float, float]]:
    """``reach`` over a run's ``validations``."""
    for elapsed, epochs_so_far, acc in points:
        if reaches(acc, target):
            return round(elapsed, 4), round(epochs_so_far, 2)
    return None


def best_acc(epochs: List[Dict[str, Any]]) -> Optional[float]:
    values = [e["val_acc"] for e in epochs if e.get("val_acc") is not None]
    return max(values) if values else None


def resolve_target(target_acc: Any, baseline_runs: Sequence[List[Dict[str, Any]]], tolerance: float) -> tuple:
    """(target or None, how it was chosen). ``auto``: the baseline's best val_acc (median over its
    repeats) minus ``tolerance``; None when the baseline validated no epoch (older journals)."""
    if target_acc is None or target_acc == "off":
        return None, "time to target off (report.target_acc=off)"
    if target_acc != AUTO:
        return float(target_acc), f"target val_acc {float(target_acc):.3f} (report.target_acc)"
    bests = [b for b in (best_acc(epochs) for epochs in baseline_runs) if b is not None]
    if not bests:
        return None, "no time to target: the baseline's epochs carry no val_acc"
    best = statistics.median(bests)
    return round(best - tolerance, 4), (
        f"target val_acc {best - tolerance:.3f} = the baseline's best {best:.3f} minus {tolerance} (report.target_acc=auto)"
    )


def usable_target(target_acc: Any, baseline_runs: Sequence[List[Dict[str, Any]]], tolerance: float) -> tuple:
    """``resolve_target``, but None (and why) for a target of 0 or below: every validation reaches it,
    so every row would "reach" it at its first one and the ratio of those times would pass for a
    time-to-target speed-up. The report's; the tuner refuses such a target in words of its own."""
    target, how = resolve_target(target_acc, baseline_runs, tolerance)
    if target is not None and target <= 0:
        return None, (
            f"no time to target: the {how} is reached before any training and tells no row apart; give "
            "report.target_acc (--target-acc) a number in (0, 1], or a report.target_tolerance "
            "(--target-tolerance) below the baseline's best val_acc"
        )
    return target, how


def speedup_interval(base: List[float], other: List[float], seed: int = 0) -> Optional[tuple]:
    """Bootstrap interval of median(base) / median(other), resampling the repeats; None under 2 each."""
    if len(base) < 2 or len(other) < 2:
        return None
    rng = random.Random(seed)
    ratios = sorted(
        statistics.median(rng.choices(base, k=len(base))) / statistics.median(rng.choices(other, k=len(other)))
        for _ in range(BOOTSTRAP_RESAMPLES)
    )
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * (BOOTSTRAP_RESAMPLES - 1))], ratios[int(round((1 - tail) * (BOOTSTRAP_RESAMPLES - 1)))]


NOT_VALIDATED = "not validated"  # a row's note starts so where a run of it logged no val_acc
NOT_REACHED = "target not reached"
BASELINE_MISSED = "no ratio to target: the baseline"  # the rest of the note says how


def row_columns(base_runs: List[List[Dict[str, Any]]], runs: List[List[Dict[str, Any]]], target: float, is_base: bool):
    """A report row's time-to-target columns: each repeat's time, the median, the speedup and its interval.

    Both sides are held to one rule: a time (and a ratio) only where every repeat reached the target.
    A row that missed in some repeats has no time; a baseline that missed in some has no ratio to
    offer the other rows, rather than one taken against only the repeats that reached it (which
    would be a faster baseline than the one that ran). A run that never validated has no time to
    target at all, which is not the same as missing it (``NOT_VALIDATED``)."""
    blank = {
        "time_to_target_s": None,
        "epochs_to_target": None,
        "time_to_target_speedup": None,
        "time_to_target_ci": None,
    }
    unvalidated, missed, reached = _outcomes(runs, target)
    if unvalidated or missed:
        notes = [f"{NOT_VALIDATED}{_of_repeats(unvalidated, len(runs))}: time to target unknown"] if unvalidated else []
        notes += [NOT_REACHED + _of_repeats(missed, len(runs))] if missed else []
        return {**blank, "note": "; ".join(notes)}
    times = [r[0] for r in reached]
    median = round(statistics.median(times), 4)
    columns = {**blank, "time_to_target_s": median, "note": None}
    columns["epochs_to_target"] = statistics.median_low([r[1] for r in reached])
    if is_base:
        return {**columns, "time_to_target_speedup": 1.0}
    base_unvalidated, base_missed, base_reached = _outcomes(base_runs, target)
    if base_unvalidated or base_missed or not base_reached:
        return {
            **columns,
            "note": f"{BASELINE_MISSED} {_baseline_shortfall(base_unvalidated, base_missed, len(base_runs))}",
        }
    if median > 0:
        base_times = [r[0] for r in base_reached]
        columns["time_to_target_speedup"] = round(statistics.median(base_times) / median, 3)
        interval = speedup_interval(base_times, times)
        columns["time_to_target_ci"] = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else None
    return columns


def _outcomes(runs: List[List[Dict[str, Any]]], target: float) -> tuple:
    """(runs that logged no val_acc, runs that validated and missed ``target``, the others' ``reach``)."""
    unvalidated = missed = 0
    reached = []
    for epochs in runs:
        points = validations(sorted(epochs, key=lambda e: e["epoch"]))
        if not points:
            unvalidated += 1
        elif (found := _first_reaching(points, target)) is None:
            missed += 1
        else:
            reached.append(found)
    return unvalidated, missed, reached


def _baseline_shortfall(unvalidated: int, missed: int, total: int) -> str:
    if total == 1:
        return "was not validated" if unvalidated else "did not reach it"
    parts = [f"missed it in {missed} of {total} repeats"] if missed else []
    parts += [f"was not validated in {unvalidated} of {total} repeats"] if unvalidated else []
    return " and ".join(parts)


def _of_repeats(count: int, total: int) -> str:
    return f" in {count} of {total} repeats" if total > 1 else ""


def to_target_interval(base: List[tuple], other: List[tuple], seed: int = 0) -> Optional[tuple]:
    """Bootstrap interval of median(base) / median(other) times to target, for runs of one seed (the tuner's).

    Each side is a list of repeats, each ``(epoch times up to the target, the run's steady epoch times[,
    the share of the last epoch trained when the target was reached])``: with ``report.val_per_epoch``
    the target may be reached part-way through an epoch, whose time is then that part's. A draw
    resamples the repeats, and in each the epochs after the warm-up from that run's steady epochs (the
    last one scaled by its share; the warm-up, compile included, stays as measured): the interval holds
    timing noise, not the seed's say in how many epochs it takes. None when neither side has anything
    to resample.
    """

    def spread(side: List[tuple]) -> bool:
        return len(side) > 1 or any(len(r[0]) > 1 and len(r[1]) > 1 for r in side)

    if not base or not other or not (spread(base) or spread(other)):
        return None
    rng = random.Random(seed)

    def draw(side: List[tuple]) -> float:
        picked = rng.choices(side, k=len(side)) if len(side) > 1 else side
        values = []
        for repeat in picked:
            times, steady = repeat[0], repeat[1]
            last = repeat[2] if len(repeat) > 2 else 1.0
            rest = len(times) - 1
            if rest and steady:
                drawn = rng.choices(steady, k=rest)
                values.append(times[0] + sum(drawn[:-1]) + drawn[-1] * last)
            else:
                values.append(sum(times))
        return statistics.median(values)

    ratios = sorted(draw(base) / draw(other) for _ in range(BOOTSTRAP_RESAMPLES))
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * (BOOTSTRAP_RESAMPLES - 1))], ratios[int(round((1 - tail) * (BOOTSTRAP_RESAMPLES - 1)))]
