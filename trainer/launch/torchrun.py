"""``python -m trainer.torchrun LOG_DIR [torchrun args]``: torchrun, with a failing rank's answer instead of torchrun's traceback.

Plain torchrun ends a failed job with its own ``ChildFailedError`` traceback and a table of exit
codes, after the rank already printed the one clear paragraph the user needs (a bad model, a bad
path). Here the ranks' stderr goes to files under LOG_DIR (torchrun's own ``--redirects``; their
stdout, where the logs go, stays on the console), and when a rank fails:

- the first failed rank's answer is printed once: its ``error: ...`` paragraph when it stopped on
  bad input, else the end of its stderr (a real crash keeps its traceback);
- the exit code is that rank's (2 for bad input, 3 for a deliberate stop, ...), as in one process;
- torchrun's launcher traceback is not shown; every rank's full stderr stays in LOG_DIR.

When the agent is signalled (a scheduler's SIGTERM, SIGUSR1, Ctrl-C), it passes the signal to every
rank, and the ranks agree on a step and save last.ckpt: they get ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
seconds for it (``checkpoint.stop_grace_s`` when the trainer launches them) before SIGKILL, not
torchrun's default 30 (``_grace_by_cause``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional

from trainer.launch.stopping import PREEMPTED_EXIT_CODE

TAIL_LINES = 40
FAILURE_GRACE_S = 5  # seconds the other ranks get to end after one failed (torchrun's agent: 30)
FIRST_FAILURE = "first_failure.json"  # in LOG_DIR: the failed rank's answer, for the job's metrics.json
# torchrun's own name (torch >= 2.12 reads it as --shutdown-timeout's default); read here for older torch too
STOP_GRACE_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_STOP_GRACE_S = 30  # torchrun's default
# set in the ranks this framework's launcher starts (processes.ranks_env), never by a user's own torchrun
LAUNCHED_RANKS_ENV = "TRAINER_LAUNCHED_RANKS"
USAGE = "usage: python -m trainer.torchrun LOG_DIR [torchrun's options] TRAINING_SCRIPT [its arguments]"


def _quiet_elastic_logs() -> None:
    """torchrun's agent logs each failed worker at ERROR level; the summary below replaces that."""
    # lazy (no torch before a job starts, trainer/__init__.py); imported for torch's log handlers, set up first
    import torch.distributed.run  # noqa: F401

    for name in ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def answer_of(stderr_text: str) -> str:
    """The rank's one-paragraph ``error:`` message if it printed one, else the tail of its stderr."""
    lines = stderr_text.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error: "):
            return "\n".join(lines[i:]).strip()
    return "\n".join(lines[-TAIL_LINES:]).strip()


def _stderr_file(log_dir: Path, local_rank: int) -> Optional[Path]:
    files = sorted(log_dir.glob(f"**/{local_rank}/stderr.log"), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def _stop_on_sigusr1() -> None:
    """SIGUSR1 (Slurm's ``--signal=USR1@...``, and what ``trainer.launch.processes`` passes on) stops the agent as
    SIGTERM does: torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT only, so SIGUSR1 killed it
    (its default action) and left its ranks training on, orphaned. Raised as torchrun's own
    ``SignalException``, the agent passes SIGUSR1 on to every rank, which saves and stops."""
    # lazy: no torch before a job starts (trainer/__init__.py)
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stop(signum, frame):
        raise SignalException(f"the agent got {signal.Signals(signum).name}", sigval=signal.Signals(signum))

    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, stop)


def stop_grace_s() -> int:
    """Seconds the ranks get, after the agent passes a stop signal on, before it sends SIGKILL."""
    try:
        return int(os.environ.get(STOP_GRACE_ENV, TORCHRUN_STOP_GRACE_S))
    except ValueError:
        return TORCHRUN_STOP_GRACE_S


def _grace_by_cause() -> None:
    """Each of torchrun's closes of the ranks (SIGTERM or the given signal, then SIGKILL after a
    grace) gets the grace its cause needs.

    - A rank failed (the process context closes the others, with no signal named): ``FAILURE_GRACE_S``,
      not 30 s. A rank blocked in C++ on the failed one (rank 0 waiting in the process group's
      rendezvous for a rank that died building its model) cannot run its Python signal handler and
      could not finish anyway, so the job's answer came 30 s late (measured: 42 s for a 2-rank job
      whose rank 1 fails at once, 12 s of it the job). A rank that can still react records its
      epochs within milliseconds.
    - The agent was signalled (it names the signal it passes on): the ranks finish the validation or
      save in flight, agree on a step and save last.ckpt, which may take minutes: ``stop_grace_s()``.
      torch >= 2.12 passes that grace itself (it reads the same variable); older torch passes none,
      and its 30 s default is what this replaces. While they save, a repeated stop signal is the
      same request again (a scheduler signals every process of a job, and the launching train.py
      passes its own on): it is ignored; a second Ctrl-C ends the ranks at once, as it ends one process.
    """
    # lazy: no torch before a job starts (trainer/__init__.py)
    from torch.distributed.elastic.multiprocessing.api import PContext

    close = PContext.close

    def close_by_cause(self, death_sig=None, timeout=None) -> None:
        if death_sig is None:
            close(self, None, FAILURE_GRACE_S if timeout is None else timeout)
            return
        with _while_the_ranks_stop(self):
            close(self, death_sig, stop_grace_s() if timeout is None else timeout)

    PContext.close = close_by_cause


@contextmanager
def _while_the_ranks_stop(pcontext):
    """The agent's handling of further signals while its ranks stop (see ``_grace_by_cause``)."""

    def again(signum, frame) -> None:
        if signum != signal.SIGINT:
            return  # the ranks already have this request
        for pid in pcontext.pids().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    names = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP", "SIGQUIT")
    previous = {}
    try:
        for s in [getattr(signal, name) for name in names if hasattr(signal, name)]:
            previous[s] = signal.signal(s, again)
    except ValueError:  # not the main thread: signals stay as they were
        pass
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _print_help() -> None:
    """This module's docstring, then torchrun's own options (LOG_DIR, the first argument, is torchrun's
    ``--log-dir``: without this, ``--help`` was taken for it and torchrun's parser refused the line)."""
    from torch.distributed.run import get_args_parser  # lazy: no torch before a job starts (trainer/__init__.py)

    about = __doc__.split("\n", 1)[1].strip()
    print(f"{USAGE}\n\n{about}\n\ntorchrun's options, after LOG_DIR:\n")
    parser = get_args_parser()
    parser.prog = "torchrun"
    parser.print_help()


def main(argv: List[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        _print_help()
        return 0
    if not argv:
        print(USAGE, file=sys.stderr)
        return 2
    log_dir = Path(argv[0])
    _quiet_elastic_logs()
    _stop_on_sigusr1()
    _grace_by_cause()
    # lazy: no torch before a job starts (trainer/__init__.py)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(["--log-dir", str(log_dir), "--redirects", "2", *argv[1:]])
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        path = _stderr_file(log_dir, failure.local_rank)
        text = path.read_text(errors="replace") if path else ""
        how = _how_it_ended(failure.exitcode)
        answer = answer_of(text) if text.strip() else f"rank {rank} {how} and printed nothing to stderr"
        if failure.exitcode == PREEMPTED_EXIT_CODE:
            # every rank stopped at the step they agreed on and saved: rank 0's metrics.json says so
            print(f"\n{answer}\n\n(every rank's stderr is under {log_dir})\n", file=sys.stderr, flush=True)
            return failure.exitcode
        _write_first_failure(log_dir, rank, answer)
        print(
            f"\n{answer}\n\n(rank {rank} {how}, which stopped the job; every rank's stderr is under {log_dir})\n",
            file=sys.stderr,
            flush=True,
        )
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    except SignalException as e:  # this launcher itself was signalled (a scheduler's SIGTERM, Ctrl-C)
        print(
            f"\nthe job's launcher received {e.sigval.name}; its ranks were stopped (their stderr is under {log_dir})\n",
            file=sys.stderr,
            flush=True,
        )
        return 128 + int(e.sigval)
    return 0


def _write_first_failure(log_dir: Path, rank: int, answer: str) -> None:
    """The reason the job failed, for the launching process to record: the other ranks were stopped by
    torchrun's SIGTERM, and the rank that writes metrics.json may be one of those."""
    paragraph = " ".join(line.strip() for line in answer.splitlines() if line.strip())
    paragraph = paragraph[len("error: ") :] if paragraph.startswith("error: ") else paragraph
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / FIRST_FAILURE).write_text(json.dumps({"rank": rank, "error": f"{paragraph[:1000]} (rank {rank})"}))


def first_failure(log_dir: str) -> Optional[str]:
    """What ``_write_first_failure`` recorded for the last launch into ``log_dir``, if anything."""
    try:
        return json.loads((Path(log_dir) / FIRST_FAILURE).read_text())["error"]
    except (OSError, ValueError, KeyError):
        return None


def _how_it_ended(exitcode: int) -> str:
    if exitcode >= 0:
        return f"exited with status {exitcode}"

    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        name = f"signal {-exitcode}"
    hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
    return f"was killed by {name}{hint}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
