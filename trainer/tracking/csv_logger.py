"""ResumableCSVLogger: Lightning's CSVLogger, kept and appended to when a job resumes into its run dir.

Lightning's CSV writer deletes ``metrics.csv`` when its directory is not empty (it assumes a new
experiment); a job resumed with ``ckpt_path=last`` or requeued after a preemption writes into the
same run dir, and would lose every epoch before the resume. This writer reads the existing header
instead, so new rows append under it (and a new column rewrites the file with the old rows kept,
as Lightning's own writer does). A requeued job that starts over from epoch 0 (no checkpoint yet)
does not append: ``trackers.build`` first moves the earlier attempt's file aside.
"""

from __future__ import annotations

import csv

from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.loggers.csv_logs import ExperimentWriter
from pytorch_lightning.loggers.logger import rank_zero_experiment


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = list(next(csv.reader(f), []))


class ResumableCSVLogger(CSVLogger):
    """``metrics.csv`` (and ``hparams.yaml``) in the run dir; a resumed job appends to them."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment
