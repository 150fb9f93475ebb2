"""The report in words: the markdown and CSV tables, the number formats, the header that says how
each column is judged, and the lines said under the console's table.

Apart from the rows so that what the numbers are and how they are written can change separately;
the console's table itself is ``trainer.console.ab_table``, which the markdown shares its
"(1 run)" mark with.
"""

from __future__ import annotations

import csv
import io
from typing import Any, Dict, List, Optional

from trainer.console import one_run, row_notes
from trainer.measure.time_to_target import BASELINE_MISSED, NOT_VALIDATED
from trainer.report.jobs import Job, Row, fold_repeats, varied_keys
from trainer.report.noise import BOOTSTRAP_RESAMPLES, CONFIDENCE
from trainer.report.rows import (
    ACC_DROP_THRESHOLD,
    NO_SPEEDUP,
    NOT_JUDGED,
    SEEDED_REPEATS,
    SEEDS,
    STOPPED_AT_TARGET,
    TIMING_ONLY,
    folded_bottleneck,
)

# the advice where a side has too few steady epochs because stop_at_acc ended it: more epochs would
# not give it more (it would stop at its target again)
STOPPED_REMEDY = (
    "stop_at_acc, not trainer.max_epochs, decided how many epochs it trained: time its epochs in a run with "
    "stop_at_acc=null, or compare the rows by their time to target"
)

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


def format_cell(value: Any, column: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if column in ("speedup", "time_to_target_speedup"):
            return f"{value:.2f}x"
        return f"{value:.{_DIGITS.get(column, 3)}f}"
    return str(value)


def to_markdown(columns: List[str], rows: List[dict]) -> str:
    out = io.StringIO()
    out.write("| " + " | ".join(columns) + " |\n")
    out.write("|" + "|".join(" --- " for _ in columns) + "|\n")
    for row in rows:
        cells = [format_cell(row.get(c), c) for c in columns]
        if row.get("time_to_target_ci_holds") == NOT_JUDGED and "time_to_target_speedup" in columns:
            # a ratio without an interval: not judged, and marked so
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


def shown_keys(columns: List[str], rows: List[dict]) -> List[str]:
    """The settings that tell the rows apart (the chart's labels, the console's configuration)."""
    return [
        c
        for c in columns[1 : columns.index("epoch_time_s")]
        if c != "repeats" and (c != "world_size" or len({r.get(c) for r in rows}) > 1)
    ]


def header_of(jobs: List[Job], base: Optional[Row], how: str) -> str:
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


def judgement_notes(rows: List[dict], base_job: Optional[str]) -> List[str]:
    """What the console table's marks mean, said under it where a row carries one."""

    def named(holds: str) -> List[str]:
        return [r["job"] for r in rows if r.get("time_to_target_ci_holds") == holds]

    out = []
    unjudged = [r for r in rows if r["job"] != base_job and r.get("speedup") is not None and not r.get("speedup_ci")]
    for stopped, remedy in ((False, "train more epochs"), (True, STOPPED_REMEDY)):
        jobs = [r["job"] for r in unjudged if (STOPPED_AT_TARGET in (r.get("notes") or "")) == stopped]
        if jobs:
            out.append(
                f"speed-up (not judged), job(s) {', '.join(jobs)}: fewer than 2 steady epochs on a side, "
                f"so no interval; {remedy}."
            )
    for mark, what, remedy in (
        (
            NO_SPEEDUP,
            "no epoch-time ratio",
            "train at least 3 epochs (trainer.max_epochs) so both sides have steady ones",
        ),
        (
            BASELINE_MISSED,
            "no time-to-target ratio",
            "rebuild the report at a target every baseline run reaches: python -m trainer.report DIR --target-acc T",
        ),
        (NOT_VALIDATED, "no time to target", "validate during training (data.val_samples, trainer.limit_val_batches)"),
    ):
        by_reason: Dict[str, List[str]] = {}
        for r in rows:
            for note in row_notes(r):
                if note.startswith(mark):
                    by_reason.setdefault(note, []).append(r["job"])
        for reason, jobs in by_reason.items():
            said = reason.split(": ", 1)[0] if mark == NOT_VALIDATED else reason.split(": ", 1)[-1]
            out.append(
                f"{what}, job(s) {'; '.join(jobs)}: {said}; {STOPPED_REMEDY if STOPPED_AT_TARGET in said else remedy}."
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


def _row_verdict(row: Row) -> Optional[str]:
    """The verdict of a repeat that got the row's bottleneck (the one most repeats got), with how many
    did where they differ; where none has a majority, that the repeats differ, and how."""
    differ: List[str] = []
    bottleneck = folded_bottleneck(row, differ)
    if bottleneck is None:
        return None
    if bottleneck == "mixed":  # (more than one verdict, so differ holds the count of each)
        return differ[0].replace("bottleneck differs across repeats: ", "the repeats' verdicts differ: ") + "."
    diagnoses = [j.metrics.get("diagnosis") or {} for j in row.jobs]
    verdict = next(d.get("verdict") for d in diagnoses if d.get("bottleneck") == bottleneck)
    if not verdict:
        return None
    agreeing = sum(d.get("bottleneck") == bottleneck for d in diagnoses)
    if agreeing < len(diagnoses):
        verdict = f"({agreeing} of {len(diagnoses)} repeats) {verdict}"
    return verdict


def verdict_lines(jobs: List[Job]) -> List[str]:
    """The doctor's verdict per job, jobs with the same verdict on one line."""
    by_verdict: Dict[str, List[str]] = {}
    for row in fold_repeats(jobs, varied_keys(jobs)):
        verdict = _row_verdict(row)
        if verdict:
            by_verdict.setdefault(verdict, []).append(row.name)
    return [
        f"doctor, job{'s' if len(names) > 1 else ''} {', '.join(names)}: {verdict}"
        for verdict, names in by_verdict.items()
    ]
