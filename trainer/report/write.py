"""The report written: ``write_report`` puts ``ab_report.md/.csv/.png`` in a dir and prints the
table, and ``main`` is the command that rebuilds them (``python -m trainer.report``, ``trainer-report``).

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
from typing import Any, Optional, Sequence

from trainer.console import TABLE_WIDTH, ab_table
from trainer.measure import time_to_target as ttt
from trainer.measure.metrics import atomic_write_text
from trainer.report.figure import chart, save_png
from trainer.report.jobs import load_jobs
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
    if os.path.exists(out) and not os.path.isdir(out):
        print(
            f"error: --out {out}: that is a file; the report is written into a folder (ab_report.md, .csv, .png)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    written = write_report(args.dirs, out, target_acc=args.target_acc, tolerance=args.target_tolerance)
    return 0 if written is not None else 1
