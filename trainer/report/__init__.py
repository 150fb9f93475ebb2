"""The A/B report a sweep ends with: one table of epoch times, speed-ups and accuracy, built from metrics.json files.

It reads every job's ``metrics.json`` from disk, so it works for any launcher (jobs in other
processes or machines) and for runs from different sweeps and days side by side:

    python -m trainer.report multirun/2026-11-22/10-00-00 [more dirs ...] [--out DIR]

(``trainer-report`` is the same command.) After a sweep, ``trainer.sweep.SweepCallback`` (a Hydra
callback, ``on_multirun_end``) calls ``write_report``: ``ab_report.md``, ``ab_report.csv`` and
``ab_report.png`` in the sweep dir, and the table printed.

The baseline row is the job with every varied key at its "off" value (the schema default), else
the first job. Jobs that differ only in ``seed``/``repeat`` (``repeats=N``, or a seed sweep) fold
into one row. Each speedup carries a bootstrap interval (``speedup_ci``); it is "within noise" when
the interval contains 1.00x.

``jobs`` finds and reads the records and folds them into rows, ``noise`` holds the statistics
(speed-up interval, accuracy noise, spreads), ``rows`` builds the table's rows with the
time-to-target columns, ``render`` writes them as markdown, CSV and the lines under the console's
table, ``figure`` draws ``ab_report.png``, ``write`` writes the files and is the command (``main``),
``sweep_record`` reads back what a sweep recorded (its "Not run" list, its target) so that a rebuild
of its report is the one it wrote.
Importers inside ``trainer`` import a name from the module that defines it; the names below are the
package's public face (the command, and what the tests and scripts call as ``report.X``).

May use: ``console`` (the console's table), ``measure``, ``config`` and the base modules (``errors``,
``paths``, ``rank``); never the training code or torch (``callbacks``, ``switches``, ``models``,
``data``: a contract in pyproject.toml), ``run`` (its sibling layer), ``cli``, ``sweep`` or ``tune``. Importing
it does not import torch (matplotlib only when a chart is drawn).
"""

from trainer.report.figure import chart
from trainer.report.jobs import Job, find_metrics, load_jobs, varied_keys
from trainer.report.noise import accuracy_noise
from trainer.report.render import to_markdown
from trainer.report.rows import TIME_TO_TARGET_COLUMNS, build_rows
from trainer.report.write import main, write_report

__all__ = [
    "TIME_TO_TARGET_COLUMNS",
    "Job",
    "accuracy_noise",
    "build_rows",
    "chart",
    "find_metrics",
    "load_jobs",
    "main",
    "to_markdown",
    "varied_keys",
    "write_report",
]
