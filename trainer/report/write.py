"""The report written: ``write_report`` puts ``ab_report.md/.csv/.png`` in a dir and prints the
table, and ``main`` is the command that rebuilds them (``python -m trainer.report``, ``trainer-report``):
a sweep's dir rebuilds the report the sweep wrote (``sweep_record``), and a report of other jobs is not
written over a sweep's own unless ``--out`` names it.

Together because the command is only its arguments' checks in front of ``write_report``; both are
the one place that joins the jobs, the rows, the words and the chart.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, List, Optional, Sequence

from trainer.console import TABLE_WIDTH, ab_table
from trainer.measure import time_to_target as ttt
from trainer.measure.metrics import atomic_write_text
from trainer.report import sweep_record
from trainer.report.figure import chart, save_png
from trainer.report.jobs import find_metrics, load_jobs
from trainer.report.render import header_of, judgement_notes, shown_keys, to_csv, to_markdown, verdict_lines
from trainer.report.rows import build_rows, target

log = logging.getLogger(__name__)

REPORT_NAMES = ("ab_report.md", "ab_report.csv", "ab_report.png")


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
    header = header_of(jobs, base, how)
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.report", description="Rebuild the A/B report from sweep or run dirs."
    )
    parser.add_argument("dirs", nargs="+", help="sweep dirs, run dirs or metrics.json files")
    parser.add_argument(
        "--out",
        help="where to write ab_report.* (default: the single dir given, else the current dir; "
        "a sweep's own report is replaced only by a report of its jobs, or where --out names it)",
    )
    parser.add_argument(
        "--target-acc",
        help="val_acc for the time-to-target columns: a number, auto (the baseline's best minus the tolerance) or off "
        "(default: the sweep's report.target_acc when rebuilding one sweep, else auto)",
    )
    parser.add_argument(
        "--target-tolerance", type=float, help="auto's margin (default: the sweep's report.target_tolerance, else 0.01)"
    )
    args = parser.parse_args(argv)
    problem = _bad_target(args) or _missing_dirs(args.dirs)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    found = find_metrics(args.dirs)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 and os.path.isdir(args.dirs[0]) else ".")
    sweep = _sweep_of(found, args.dirs, out)
    problem = ((None if args.out else _replaces_a_sweeps_report(out, sweep)) or _out_problem(out)) if found else None
    if problem:
        print(problem, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = sweep_record.recorded_report(sweep) if sweep else {}
    if args.target_acc is not None:
        settings["target_acc"] = args.target_acc
    if args.target_tolerance is not None:
        settings["tolerance"] = args.target_tolerance
    written = write_report(args.dirs, out, **settings)
    return 0 if written is not None else 1


def _bad_target(args: argparse.Namespace) -> Optional[str]:
    """Why --target-acc or --target-tolerance is not allowed (None: both are); --target-acc made a number."""
    if args.target_acc is not None and args.target_acc not in (ttt.AUTO, "off"):
        try:
            value = float(args.target_acc)
        except ValueError:
            value = math.nan
        if not 0 < value <= 1:  # the range report.target_acc allows (NaN fails it too)
            return f"error: --target-acc {args.target_acc!r}: allowed are auto, off or a number in (0, 1]"
        args.target_acc = value
    if args.target_tolerance is not None and not 0 <= args.target_tolerance < 1:
        return f"error: --target-tolerance {args.target_tolerance:g}: allowed is a number in [0, 1)"
    return None


def _missing_dirs(dirs: Sequence[str]) -> Optional[str]:
    missing = [d for d in dirs if not os.path.exists(d)]
    return f"error: no such dir: {', '.join(missing)}" if missing else None


def _sweep_of(found: List[Path], dirs: Sequence[str], out: str) -> Optional[Path]:
    """The sweep dir whose jobs ``found`` are, all of them and no other (a sweep dir given, or its job dirs
    given from inside it), else None: its report is the sweep's own, rebuilt from what the sweep recorded."""
    jobs = {p.resolve() for p in found}
    candidates = [Path(d) for d in dirs if os.path.isdir(d)] + [Path(out)] + [p.parent.parent for p in found[:1]]
    for candidate in candidates:
        if sweep_record.is_sweep_dir(candidate) and {p.resolve() for p in find_metrics([str(candidate)])} == jobs:
            return candidate
    return None


def _replaces_a_sweeps_report(out: str, sweep: Optional[Path]) -> Optional[str]:
    """Why writing into ``out`` (not named by --out) would replace a sweep's own report with one of other
    jobs (None: it would not): the sweep's ab_report.* (its "Not run" list, its target) is kept."""
    there = Path(out)
    if not sweep_record.is_sweep_dir(there) or not any((there / name).exists() for name in REPORT_NAMES):
        return None
    if sweep is not None and sweep.resolve() == there.resolve():
        return None
    named = out if there.is_absolute() else f"{out} ({there.resolve()})"
    return (
        f"error: {named} is a sweep dir, and its ab_report.md, .csv and .png are the sweep's own report of its jobs; "
        "the dirs given are another set of jobs, and writing their report there would replace the sweep's. Give --out "
        f"DIR to write it elsewhere (or --out {out} to replace the sweep's report), or give the sweep dir alone to "
        "rebuild its report."
    )


def _out_problem(out: str) -> Optional[str]:
    """Why ab_report.* cannot be written into ``out`` (None: the folder is there now): a file, or a path
    under one, is the user's one paragraph, not a traceback."""
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        return None
    except OSError as e:
        blocking = next((p for p in (Path(out), *Path(out).parents) if p.exists() and not p.is_dir()), None)
        if blocking is None:
            return f"error: --out {out}: cannot make that folder ({e.strerror or e})"
        where = "that is a file" if blocking == Path(out) else f"{blocking} is a file"
        return f"error: --out {out}: {where}; the report is written into a folder (ab_report.md, .csv, .png)"
