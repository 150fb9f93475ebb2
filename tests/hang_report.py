"""What a command that ran past its test's timeout was doing, for the failure report, then the end of it.

A run that hangs (ranks waiting on each other, a loader worker that never answers) would otherwise
fail its test with only "timed out after 600 seconds" and leave its processes running: torchrun's
agent, the ranks and their loader workers are grandchildren of the command, which a kill of the
command alone does not reach. ``end_hung(pid, args)`` takes, for the command and every process under
it, the Python stacks of every thread (``py-spy dump``, from the test extras: it reads a live
process's stacks without its cooperation), then native frames where they come within a short
budget (a wait inside gloo, Arrow or a lock shows only there; unwinding a process that loaded torch
can take long), and the end of each rank's stderr file (torchrun's ``--redirects`` writes them under
the run directory); it prints them to the test's stderr, which pytest shows with the failure, and
SIGKILLs the whole tree whatever the report met on the way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

PYTHON_STACKS_TIMEOUT_S = 15
NATIVE_STACKS_TIMEOUT_S = 10
REPORT_BUDGET_S = 120  # the whole report; the kill follows it in any case
STDERR_TAIL_LINES = 30


def _py_spy():
    near = Path(sys.executable).with_name("py-spy")
    return str(near) if near.exists() else shutil.which("py-spy")


def _tree(pid: int):
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _dump(py_spy: str, pid: int, native: bool, timeout: float) -> str:
    try:
        out = subprocess.run(
            [py_spy, "dump", *(["--native"] if native else []), "--pid", str(pid)],
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            env=dict(os.environ, RUST_BACKTRACE="0"),  # py-spy's own backtrace for a process it cannot read: noise
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({'native' if native else 'python'} stacks: {e})"
    return (out.stdout + out.stderr).strip()


def _stacks(proc, py_spy, deadline: float) -> str:
    head = f"--- pid {proc.pid}: {' '.join(_cmdline(proc))[:200]}"
    if py_spy is None:
        return head + "\n(py-spy not installed: pip install -e '.[test]')"
    left = deadline - time.monotonic()
    if left <= 1:
        return head + "\n(no time left in the report's budget)"
    text = _dump(py_spy, proc.pid, False, min(PYTHON_STACKS_TIMEOUT_S, left))
    left = deadline - time.monotonic()
    if left > 1:
        text += "\nnative:\n" + _dump(py_spy, proc.pid, True, min(NATIVE_STACKS_TIMEOUT_S, left))
    return f"{head}\n{text}"


def _cmdline(proc) -> List[str]:
    try:
        return proc.cmdline()
    except Exception:  # noqa: BLE001 - gone, or a zombie
        return ["?"]


def _rank_stderr(args: List[str], cwd) -> List[str]:
    """The ends of the ranks' stderr files under the command's run directory (``hydra.run.dir=`` /
    ``hydra.sweep.dir=``, relative to the command's working directory)."""
    runs = [a.split("=", 1)[1] for a in args if a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
    tails = []
    for run in runs:
        for path in sorted((Path(cwd) / run).glob("**/ranks/**/stderr.log")):
            lines = path.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
            tails.append(f"--- {path}\n" + "\n".join(lines))
    return tails


def end_hung(pid: int, args: List[str], cwd=".") -> None:
    """Print what the process tree under ``pid`` was doing to stderr, then SIGKILL the tree."""
    import psutil

    procs = _tree(pid)
    try:
        py_spy = _py_spy()
        deadline = time.monotonic() + REPORT_BUDGET_S
        parts = [f"=== the command ran past its timeout: {len(procs)} processes, each thread's stack ==="]
        parts += [_stacks(p, py_spy, deadline) for p in procs]
        parts += _rank_stderr(args, cwd)
        print("\n".join(parts), file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - the report is a courtesy; the kill below is not
        print(f"(the hang report failed: {type(e).__name__}: {e})", file=sys.stderr, flush=True)
    finally:
        procs += [c for c in _tree(pid) if c not in procs]  # started while the report ran
        for p in reversed(procs):  # the deepest first
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=10)
