"""One probe of the tuner: a real training run of one configuration, in its own process and run dir,
and the journal that lets a killed tune resume without repeating a finished probe.

A probe is ``python -m trainer.cli`` with the user's overrides, the configuration's and the probe's
own (a fixed number of steps per epoch, one warm-up epoch, no validation or checkpoints). Each runs
in a fresh process so that nothing carries over between configurations (a compiled graph, an
allocator preloaded by re-launch, torch.backends settings), and is timed by the same EpochTimer as
any run: its metrics.json is the measurement.

The journal (``tune_journal.jsonl``) holds one line per finished probe. The search is a function of
the probes' results, so a resumed tune replays it: the n-th request for a configuration is answered
from the journal's n-th record of it, and only what was never finished runs again.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Dict, List, Optional

from ..errors import ConfigError

log = logging.getLogger("trainer.tune")

JOURNAL = "tune_journal.jsonl"


@dataclass
class Result:
    """What the tuner needs from one probe's (or verification's) metrics.json."""

    kind: str  # "probe" or "verify"
    config: List[str]  # the configuration's overrides (on top of the user's)
    dir: str
    status: str  # ok | failed
    error: Optional[str] = None
    steady: List[List[float]] = field(default_factory=list)  # [time_s, samples] of each measured epoch
    compile_s: float = 0.0
    bottleneck: Optional[str] = None
    verdict: Optional[str] = None
    val_acc: Optional[float] = None
    val_samples: Optional[int] = None
    epoch_samples: Optional[float] = None  # median samples of a training epoch
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok" and (self.kind == "verify" or bool(self.steady))

    def epoch_times(self, full_samples: float, horizon_epochs: int) -> List[float]:
        """Each measured epoch as the time of a full epoch of the real run, compile time spread over the horizon."""
        return [t / max(1.0, s) * full_samples + self.compile_s / max(1, horizon_epochs) for t, s in self.steady]


def _from_metrics(kind: str, config: List[str], run_dir: Path, wall_s: float, stderr: str) -> Result:
    from .. import metrics as metrics_io

    path = run_dir / "metrics.json"
    if not path.exists():
        tail = " ".join(stderr.strip().splitlines()[-3:])[-400:] if stderr.strip() else "no output"
        return Result(kind, config, str(run_dir), "failed", error=f"the run wrote no metrics.json ({tail})", wall_s=wall_s)
    m = metrics_io.read(str(path))
    epochs = [e for e in m.get("epochs", []) if e.get("time_s") and e.get("samples")]
    steady = [[e["time_s"], e["samples"]] for e in epochs if not e.get("warmup")]
    diagnosis = m.get("diagnosis") or {}
    return Result(
        kind,
        config,
        str(run_dir),
        m.get("status", "failed"),
        error=m.get("error"),
        steady=steady,
        compile_s=float(m.get("compile_time_s") or 0.0),
        bottleneck=diagnosis.get("bottleneck"),
        verdict=diagnosis.get("verdict"),
        val_acc=m.get("val_acc"),
        val_samples=m.get("val_samples"),
        epoch_samples=median([e["samples"] for e in epochs]) if epochs else None,
        wall_s=wall_s,
    )


class Journal:
    """Append-only record of finished probes in the tune's run dir."""

    def __init__(self, run_dir: Path, user_overrides: List[str]) -> None:
        self.path = run_dir / JOURNAL
        self.records: List[Dict[str, Any]] = []
        if self.path.exists():
            lines = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
            header = lines[0] if lines else {}
            if header.get("overrides") != user_overrides:
                raise ConfigError(
                    f"{run_dir} holds a tune of other overrides ({' '.join(header.get('overrides') or []) or 'none'}); "
                    "a tune resumes only with the same command line. Give the same overrides, or another hydra.run.dir."
                )
            self.records = lines[1:]
        else:
            with open(self.path, "w") as f:
                f.write(json.dumps({"tune": 1, "overrides": user_overrides}) + "\n")
        self._served: Dict[str, int] = {}

    @staticmethod
    def _key(kind: str, config: List[str]) -> str:
        return json.dumps([kind, sorted(config)])

    def replay(self, kind: str, config: List[str]) -> Optional[Result]:
        """The next unused journal record of this configuration, if the killed tune had finished it."""
        key = self._key(kind, config)
        n = self._served.get(key, 0)
        matches = [r for r in self.records if r["key"] == key]
        if n < len(matches):
            self._served[key] = n + 1
            record = dict(matches[n])
            record.pop("key")
            return Result(**record)
        return None

    def add(self, result: Result) -> None:
        key = self._key(result.kind, result.config)
        self._served[key] = self._served.get(key, 0) + 1
        record = {"key": key, **asdict(result)}
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


class Prober:
    """Runs probes and verifications as real training runs, one at a time, under ``run_dir``."""

    def __init__(self, run_dir: Path, user_overrides: List[str], tune_cfg: Any, journal: Journal) -> None:
        self.run_dir = run_dir
        self.user = list(user_overrides)
        self.cfg = tune_cfg
        self.journal = journal
        self.spent_s = 0.0  # probe time so far, journal included: a resumed tune keeps its budget

    def _next_dir(self, kind: str, name: str) -> Path:
        parent = self.run_dir / ("probes" if kind == "probe" else "verify")
        parent.mkdir(parents=True, exist_ok=True)
        n = len([p for p in parent.iterdir() if p.is_dir()])
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
        return parent / f"{n:02d}-{safe}"

    def run(self, kind: str, name: str, config: List[str]) -> Result:
        replayed = self.journal.replay(kind, config)
        if replayed is not None:
            self.spent_s += replayed.wall_s
            return replayed
        run_dir = self._next_dir(kind, name)
        if kind == "probe":
            settings = [
                f"trainer.max_epochs={self.cfg.probe_epochs}",
                f"trainer.limit_train_batches={self.cfg.probe_batches}",
                "trainer.limit_val_batches=0",
                "checkpoint.enabled=false",
            ]
        else:
            settings = [f"trainer.max_epochs={self.cfg.verify_epochs}", "checkpoint.enabled=false"]
        cmd = [sys.executable, "-m", "trainer.cli", *self.user, *config, *settings, f"hydra.run.dir={run_dir}"]
        env = dict(os.environ, TRAINER_QUIET_CONSOLE="1")
        start = time.perf_counter()
        # its own session: a timed-out probe is stopped with every process it started (loader workers, ranks)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        limit = max(300.0, 60.0 * self.cfg.budget_min)
        try:
            _, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            stderr = f"stopped after {limit:.0f} s"
        wall = time.perf_counter() - start
        result = _from_metrics(kind, config, run_dir, wall, stderr)
        if result.status == "ok" and proc.returncode not in (0, None):
            result.status, result.error = "failed", f"exit code {proc.returncode}"
        self.spent_s += wall
        self.journal.add(result)
        return result
