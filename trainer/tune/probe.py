"""One probe of the tuner: a real training run of one configuration, in its own process and run dir,
and the journal that lets a killed tune resume without repeating a finished probe.

A probe is ``python -m trainer.cli`` with the user's overrides, the configuration's and the probe's
own (a fixed number of steps per epoch, one warm-up epoch, no validation or checkpoints). Each runs
in a process of its own so that nothing carries over between configurations (a compiled graph, an
allocator preloaded by re-launch, torch.backends settings): forked from a server that has imported
torch and nothing of ours (``trainer/launch/preloaded.py``, ``tune.preloaded_probes``), or a fresh
interpreter. It is timed by the same EpochTimer as any run: its metrics.json is the measurement.

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
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainer.errors import ConfigError
from trainer.launch import preloaded
from trainer.measure.metrics import atomic_write_text
from trainer.tune.result import Result, from_metrics, last_lines

log = logging.getLogger("trainer.tune")

JOURNAL = "tune_journal.jsonl"


def check_header(line: str, header: Dict[str, Any], run_dir: Path) -> Optional[str]:
    """Why a journal's first line does not belong to this tune (None if it does); settings None: not compared."""
    try:
        found = json.loads(line)
    except ValueError:
        found = None
    if not isinstance(found, dict) or "tune" not in found:
        return (
            f"{run_dir / JOURNAL} does not start with a tune journal's first line (the file is damaged, or not a "
            "tune's), so the tune cannot resume from it. Give another hydra.run.dir, or move the file away to start over there."
        )
    if found.get("overrides") != header["overrides"]:
        return (
            f"{run_dir} holds a tune of other overrides ({' '.join(found.get('overrides') or []) or 'none'}); "
            "a tune resumes only with the same command line. Give the same overrides, or another hydra.run.dir."
        )
    if header["settings"] is not None and found.get("settings") != header["settings"]:
        return (
            f"{run_dir} holds a tune with other probe settings ({found.get('settings')}, now {header['settings']}); its "
            "measurements would not compare. Resume with the same tune.* values, or give another hydra.run.dir."
        )
    return None


def _record(line: str) -> Dict[str, Any]:
    record = json.loads(line)
    Result(**{k: v for k, v in record.items() if k != "key"})  # every field present and named
    if not isinstance(record["key"], str):
        raise TypeError("key")
    return record


class Journal:
    """Append-only record of finished probes in the tune's run dir."""

    def __init__(self, run_dir: Path, user_overrides: List[str], settings: Dict[str, Any]) -> None:
        self.path = run_dir / JOURNAL
        self.records: List[Dict[str, Any]] = []
        header = {"tune": 1, "overrides": user_overrides, "settings": settings}
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            problem = check_header(lines[0] if lines else "", header, run_dir)
            if problem:
                raise ConfigError(problem)
            for i, line in enumerate(lines[1:], start=2):
                try:
                    self.records.append(_record(line))
                except (ValueError, KeyError, TypeError):
                    if i == len(lines):  # the tune was killed while appending this line: that probe runs again
                        log.warning("%s: its last line was cut short (a killed tune); that probe runs again", self.path)
                        continue
                    raise ConfigError(
                        f"{self.path} line {i} is not a journal record; the tune cannot resume from it. "
                        "Give another hydra.run.dir to start a new tune."
                    ) from None
            # rewrite without the cut line, so the next record starts on a line of its own
            _write_journal(self.path, lines[0], self.records)
        else:
            with open(self.path, "w") as f:
                f.write(json.dumps(header) + "\n")
        self._replayed: Optional[int] = 0  # records served so far; None once the tune asked for another run

    @staticmethod
    def _key(kind: str, config: List[str]) -> str:
        return json.dumps([kind, sorted(config)])

    def replay(self, kind: str, config: List[str]) -> Optional[Result]:
        """The killed tune's next record, if it is of this run; else None from here on.

        Records are served strictly in the order they were made: a search given the same settings asks
        for the same runs in the same order. A resume that asks for another run at some point (a larger
        ``tune.budget_min`` going past where the first one stopped, a changed ``tune.only``) runs that
        and everything after it again, and the rest of the journal is set aside (``_set_aside``): served by
        configuration alone, the old end-of-tune measurements would answer the new search's "measured
        again right after" and "back to back" requests with runs made at another time."""
        if self._replayed is None:
            return None
        n = self._replayed
        if n < len(self.records) and self.records[n]["key"] == self._key(kind, config):
            self._replayed = n + 1
            record = dict(self.records[n])
            record.pop("key")
            return Result(**record)
        if n < len(self.records):
            self._set_aside(n)
        self._replayed = None
        return None

    def _set_aside(self, n: int) -> None:
        """Keep the first ``n`` records in the journal and move the rest to a file beside it (not deleted:
        a resume given the wrong settings by mistake, then stopped, loses nothing but its place)."""
        aside = self.path.with_name(f"{self.path.stem}.set_aside.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        with open(self.path) as f:
            header = f.readline().rstrip("\n")
        _write_journal(aside, header, self.records[n:])
        self.records = self.records[:n]
        _write_journal(self.path, header, self.records)
        log.warning(
            "%s: from its record %d on, this tune asks for other runs than the journal holds (a changed budget "
            "or candidates): they are measured again; the journal's other records are kept in %s",
            self.path,
            n + 1,
            aside,
        )

    def add(self, result: Result) -> None:
        self._replayed = None  # a new run: what follows in this tune is new too
        record = {"key": self._key(result.kind, result.config), **asdict(result)}
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _write_journal(path: Path, header: str, records: List[Dict[str, Any]]) -> None:
    """A journal file of ``header`` and ``records``, written whole and atomically (a kill leaves the old one)."""
    atomic_write_text(str(path), "\n".join([header, *(json.dumps(r) for r in records)]) + "\n")


def run_settings(kind: str, tune_cfg: Any) -> List[str]:
    """The overrides that make a run a probe (a few short epochs, no validation), a verification, or a
    time-to-target run (the verification's schedule, validated every epoch; the search adds stop_at_acc).
    The tuner decides where its runs stop: a stop_at_acc among the user's overrides would cut the
    baseline's training short (and with it the target it sets) and is refused on a probe, which does
    not validate, so every run starts with none."""
    own = ["checkpoint.enabled=false", "stop_at_acc=null"]
    if kind == "target" or (kind == "verify" and getattr(tune_cfg, "objective", None) == "time_to_target"):
        return [f"trainer.max_epochs={tune_cfg.verify_epochs}", "trainer.check_val_every_n_epoch=1", *own]
    if kind == "probe":
        return [
            f"trainer.max_epochs={tune_cfg.probe_epochs}",
            f"trainer.limit_train_batches={tune_cfg.probe_batches}",
            "trainer.limit_val_batches=0",
            *own,
        ]
    return [f"trainer.max_epochs={tune_cfg.verify_epochs}", *own]


def result_of(run_dir: Path, config: List[str]) -> Result:
    """A finished probe's result, read back from its run dir."""
    return from_metrics("probe", config, run_dir, 0.0, "")


class Prober:
    """Runs probes and verifications as real training runs, one at a time, under ``run_dir``."""

    def __init__(self, run_dir: Path, user_overrides: List[str], tune_cfg: Any, journal: Journal) -> None:
        self.run_dir = run_dir
        self.user = list(user_overrides)
        self.cfg = tune_cfg
        self.journal = journal
        self.spent_s = 0.0  # probe time so far, journal included: a resumed tune keeps its budget
        self.longest_verify_s = 0.0  # the longest finished verification (its full epochs), journal included

    def _next_dir(self, kind: str, name: str) -> Path:
        parent = self.run_dir / {"probe": "probes", "verify": "verify", "target": "to_target"}[kind]
        parent.mkdir(parents=True, exist_ok=True)
        n = len([p for p in parent.iterdir() if p.is_dir()])
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
        return parent / f"{n:02d}-{safe}"

    def _start(self, args: List[str], env: dict, stderr_path: str):
        """The probe's process, in a session of its own (a timed-out probe is stopped with every process
        it started: loader workers, ranks) that dies with the tuner (a killed tune leaves no run behind
        to slow the next one). ``tune.preloaded_probes``: forked from a server that has imported torch
        (trainer/launch/preloaded.py: the 3-5 s of imports paid once per tune, not per probe), unless the probe's
        environment differs in what those imports read; else a fresh ``python``."""
        if self.cfg.get("preloaded_probes", True) and preloaded.forkable(env):
            return preloaded.start(args, os.getcwd(), env, stderr=stderr_path, new_session=True, die_with_parent=True)
        with open(stderr_path, "w") as err:
            return subprocess.Popen(
                [sys.executable, *args],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                start_new_session=True,
                preexec_fn=preloaded.set_parent_death_signal,
            )

    def run(self, kind: str, name: str, config: List[str], extra: tuple = ()) -> Result:
        """One probe of ``config``; ``extra``: settings of this run that are not part of the configuration
        (the target's stop_at_acc), derived from the journal's earlier records, so a replay gets the same."""
        replayed = self.journal.replay(kind, config)
        if replayed is not None:
            self.spent_s += replayed.wall_s
            self._count(replayed)
            return replayed
        run_dir = self._next_dir(kind, name)
        args = [
            "-m",
            "trainer.cli",
            *self.user,
            *config,
            *run_settings(kind, self.cfg),
            *extra,
            f"hydra.run.dir={run_dir}",
        ]
        env = dict(os.environ, TRAINER_QUIET_CONSOLE="1")
        limit = self.time_limit_s(kind)
        stopped = None
        if self.cfg.get("preloaded_probes", True):
            preloaded.context()  # the server's own start (its imports) is the tune's, not the first probe's
        with tempfile.NamedTemporaryFile(prefix="probe-stderr-", suffix=".txt") as err:
            start = time.perf_counter()
            proc = self._start(args, env, err.name)
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.wait()
                stopped = f"stopped after {limit:.0f} s ({LIMIT_REASON[kind]}: see {run_dir}/train.log)"
            except BaseException:
                _kill(proc)
                proc.wait()
                raise
            wall = time.perf_counter() - start
            stderr = Path(err.name).read_text(errors="replace")
        result = from_metrics(kind, config, run_dir, wall, stderr or "")
        if result.status != "ok" or proc.returncode != 0:
            reason = stopped or result.error or last_lines(stderr) or f"exit code {proc.returncode}"
            result.status, result.error = "failed", reason
        self.spent_s += wall
        self._count(result)
        self.journal.add(result)
        return result

    def time_limit_s(self, kind: str) -> Optional[float]:
        """Seconds after which a run of ``kind`` is stuck and stopped (None: not bounded). A probe is a few
        short epochs. A run to the target (time_to_target) that takes three times the longest
        verification (the baseline's, which reached the target, comes first) is no contender, and a hung
        one (a loader's deadlock) would hold the tune for ever. A verification is not bounded."""
        if kind == "probe":
            return max(300.0, 60.0 * self.cfg.budget_min)
        if kind == "target" and self.longest_verify_s:
            return max(300.0, 3.0 * self.longest_verify_s)
        return None

    def _count(self, result: Result) -> None:
        if result.kind == "verify" and result.status == "ok":
            self.longest_verify_s = max(self.longest_verify_s, result.wall_s)


LIMIT_REASON = {
    "probe": "a probe should take seconds",
    "target": "three times the longest verification, the baseline's included, which reached the target",
}


def _kill(proc) -> None:
    """SIGKILL to the probe's session (its loader workers, its ranks); to the probe alone if it has not
    made its session yet (a forked probe calls setsid first thing)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
