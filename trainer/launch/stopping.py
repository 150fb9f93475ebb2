"""Stop requests: SIGTERM, SIGUSR1 and Ctrl-C mean "stop after the step in flight, once last.ckpt is saved"
(and submitit's SIGUSR2 in a submitit job that waits for processes it started: ``trainer.launch.processes``).

One record per process, because a local sweep (Hydra's basic launcher) runs every job in this one
process: the job in flight saves and stops (``checkpointing.PreemptionCallback``), and then the
sweep stops too (``sweep.SweepStopped``) instead of starting its next job. A second Ctrl-C stops at
once (Python's KeyboardInterrupt), as a user pressing it twice expects.

Where a run is still setting up (reading or copying data, building the model, searching the batch
size: ``stop_during_setup``), there is no step to finish and nothing to save: the signal raises
``Stopped`` at once. After training (results being written) it only records the request, which the
sweep reads between jobs, so a finished job's result is always written.

Installed for a single run by ``trainer.cli``, for a whole local sweep when it starts (only where
its jobs run in this process: a Slurm sweep's process just waits, and stops as any process does),
and during ``fit`` by ``PreemptionCallback``, which also keeps Lightning from installing its own
SIGTERM handler inside ``fit`` (``trainer.launch.stop_agreement``): a stop is ours alone, everywhere.
Nested installs restore what they replaced.
"""

from __future__ import annotations

import signal
from typing import Any, Dict, List, Optional

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL, "try again later": a run that stopped on a signal after saving last.ckpt

SIGNALS = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None
)
# submitit's time-limit and preemption signal (Hydra's Slurm launcher): a stop request only in the
# process of a submitit job that launched the job's processes itself (``trainer.launch.processes``)
SUBMITIT_SIGNAL = getattr(signal, "SIGUSR2", None)


class Stopped(BaseException):
    """A stop signal while a run was setting up: nothing trained, nothing to save. A BaseException,
    like KeyboardInterrupt, so that no ``except Exception`` on the way mistakes it for a failure."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name} before training started (nothing to save)")
        self.signal_name = signal_name


class _Request:
    signal_name: Optional[str] = None
    raise_now = False  # setting up: a signal raises Stopped instead of waiting for a step boundary


_request = _Request()
_saved: List[Dict[int, Any]] = []


def _on_signal(signum, frame) -> None:
    if _request.signal_name is None:
        _request.signal_name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            # the next Ctrl-C interrupts at once (KeyboardInterrupt), wherever the process is
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if _request.raise_now:
            _request.raise_now = False
            raise Stopped(_request.signal_name)
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt


def stop_during_setup(on: bool) -> None:
    """``on``: a run starts setting up (raises Stopped if a stop was already asked for); ``off``: its
    training steps (or its result writing) begin, where a stop waits for a safe point."""
    _request.raise_now = on
    if on and _request.signal_name:
        _request.raise_now = False
        raise Stopped(_request.signal_name)


def requested() -> Optional[str]:
    """The name of the signal that asked this process to stop (``SIGTERM``, ``SIGINT``, ...), or None."""
    return _request.signal_name


def clear() -> None:
    _request.signal_name = None


def install(also: tuple = ()) -> bool:
    """Route the stop signals (and ``also``'s) here (main thread only); returns whether it did. Pair
    with ``uninstall``."""
    previous: Dict[int, Any] = {}
    try:
        for s in (*SIGNALS, *also):
            if s == signal.SIGINT and _request.signal_name:
                continue  # already asked once: a further Ctrl-C keeps stopping at once
            previous[s] = signal.signal(s, _on_signal)
    except ValueError:  # not the main thread: signals cannot be handled here
        for s, handler in previous.items():
            signal.signal(s, handler)
        return False
    _saved.append(previous)
    return True


def uninstall_all() -> None:
    """Restore the handlers that were in place before the first ``install`` (the process is done)."""
    while _saved:
        uninstall()


def uninstall() -> None:
    """Restore the handlers the matching ``install`` replaced."""
    if not _saved:
        return
    for s, handler in _saved.pop().items():
        try:
            signal.signal(s, handler)
        except (ValueError, TypeError):
            pass
