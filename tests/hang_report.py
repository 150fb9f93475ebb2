"""What a command that ran past its test's timeout was doing, for the failure report, then the end of it.

A run that hangs (ranks waiting on each other, a loader worker that never answers) would otherwise
fail its test with only "timed out after 600 seconds" and leave its processes running: torchrun's
agent, the ranks and their loader workers are grandchildren of the command, which a kill of the
command alone does not reach. ``end_hung(pid, args)`` takes, for the command and every process under
it, the Python stacks of every thread (``py-spy dump``, from the test extras: it reads a live
process's stacks without its cooperation) and the end of each rank's stderr file (torchrun's
``--redirects`` writes them under the run directory), prints them to the test's stderr, which pytest
shows with the failure, and then SIGKILLs the whole tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

STACK_DUMP_TIMEOUT_S = 20
STDERR_TAIL_LINES = 30


def _py_spy():
    near = Path(sys.executable).with_name("py-spy")
    return str(near) if near.exists() else shutil.which("py-spy")


def _tree(pid: int):
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stacks(proc, py_spy) -> str:
    head = f"--- pid {proc.pid}: {' '.join(_cmdline(proc))[:200]}"
    if py_spy is None:
        return head + "\n(py-spy not installed: pip install -e '.[test]')"
    # native frames too: a wait inside a library (gloo, Arrow, a lock) shows only there; Python's alone
    # where the native unwind fails
    for extra in (["--native"], []):
        try:
            out = subprocess.run(
                [py_spy, "dump", *extra, "--pid", str(proc.pid)],
                capture_output=True,
                text=True,
                timeout=STACK_DUMP_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{head}\n(no stacks: {e})"
        if out.returncode == 0:
            break
    return f"{head}\n{(out.stdout + out.stderr).strip()}"


def _cmdline(proc) -> List[str]:
    try:
        return proc.cmdline()
    except Exception:  # noqa: BLE001 - gone, or a zombie
        return ["?"]


def _rank_stderr(args: List[str]) -> List[str]:
    """The ends of the ranks' stderr files under the command's run directory (``hydra.run.dir=``)."""
    runs = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    tails = []
    for run in runs:
        for path in sorted(Path(run).glob("ranks/**/stderr.log")):
            lines = path.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
            tails.append(f"--- {path}\n" + "\n".join(lines))
    return tails


def end_hung(pid: int, args: List[str]) -> str:
    """Report what the process tree under ``pid`` was doing (printed to stderr, also returned), then SIGKILL it."""
    procs = _tree(pid)
    py_spy = _py_spy()
    parts = [f"=== the command ran past its timeout: {len(procs)} processes, each thread's Python stack ==="]
    parts += [_stacks(p, py_spy) for p in procs]
    parts += _rank_stderr(args)
    report = "\n".join(parts)
    print(report, file=sys.stderr, flush=True)
    for p in reversed(procs):  # the deepest first: a killed parent's children would be reparented
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    for p in procs:
        try:
            p.wait(10)
        except Exception:  # noqa: BLE001 - gone, or not our child (reaped by its own parent)
            pass
    return report
