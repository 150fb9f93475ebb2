"""``python ARGS`` without Python's start-up: a process forked from a server that has already imported
the slow libraries, which then runs the command as a fresh interpreter would.

Why this exists: importing torch, torchvision and the torchmetrics that Lightning pulls in takes 3-5 s
of one core before a command does anything. The tuner runs each probe as its own process (so that
nothing carries over between configurations) and a probe of a small configuration trains for about
a second, so most of a tune's time went to those imports. The server is the standard library's
forkserver with a preload list: a fresh interpreter (started by exec, never forked from the caller,
so whatever the caller did with CUDA does not reach it) that imports those libraries and nothing
else: not ``trainer``, Lightning or Hydra, whose state at import depends on what ran before (Lightning
gives its logger a stderr handler of its own only when the root logger has none yet). Importing torch
does not initialize CUDA, so a probe forked from it initializes its own GPU as a fresh process does.
(multiprocessing itself gives each child the caller's ``sys.path`` and imports the caller's main
module under another name, as for any forkserver child: for the tuner, ``trainer.tune``'s entry
point, which imports no torch and runs nothing when so imported.)

From the fork on, the command runs as ``python ARGS`` would: ``sys.argv``, ``sys.path[0]``, the working
dir and the environment are the command's, stdout and stderr go where it is told, ``__main__`` is the
script (or ``-m`` module), an uncaught exception prints its traceback and exits 1, ``sys.exit``'s code
is the exit code, threads are joined and exit handlers run, and multiprocessing sees the main process
of a fresh interpreter (a loader's workers start as they would, not through the server).

What a forked run cannot give: environment variables that the preloaded libraries read at import
(OpenMP's and torch's thread settings, ``LD_PRELOAD``, a rank's ``RANK``): ``forkable`` says whether a
command's environment differs from the server's only in variables read while running; where it does
not, the caller starts a fresh interpreter.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from multiprocessing import forkserver
from typing import Dict, List, Optional

# what the server imports before it forks: the slow imports every trainer command makes
PRELOAD = ["torch", "torchvision", "torchmetrics"]
# import-time settings: a command whose environment differs from the server's in one of these (or in
# any variable of these prefixes) needs a fresh interpreter
IMPORT_TIME_PREFIXES = (
    "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "TORCH_", "PYTORCH_", "CUDA_", "NCCL_", "LD_", "PYTHON",
)  # fmt: skip
IMPORT_TIME_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "PATH"}

_server_env: Optional[Dict[str, str]] = None


def forkable(env: Dict[str, str], server_env: Optional[Dict[str, str]] = None) -> bool:
    """Whether a command with environment ``env`` can be forked from a server started with
    ``server_env`` (the running server's, else this process's): they differ in no import-time variable."""
    reference = server_env if server_env is not None else (_server_env or dict(os.environ))
    changed = {k for k in set(env) | set(reference) if env.get(k) != reference.get(k)}
    return not any(k.startswith(IMPORT_TIME_PREFIXES) or k in IMPORT_TIME_NAMES for k in changed)


def context(env: Optional[Dict[str, str]] = None):
    """The forkserver context; the server starts (once per process) with ``env`` (default: ours)."""
    global _server_env
    ctx = multiprocessing.get_context("forkserver")
    if _server_env is None:
        env = dict(os.environ) if env is None else dict(env)
        ctx.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)  # the server's environment is this when it starts
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_env = env
    return ctx


def server_env() -> Optional[Dict[str, str]]:
    return _server_env


class Child:
    """A command forked from the server: ``pid``, ``wait(timeout)`` and ``returncode`` as a Popen's."""

    def __init__(self, args: List[str], process) -> None:
        self.args = args
        self.process = process
        self.pid = process.pid

    @property
    def returncode(self) -> Optional[int]:
        return self.process.exitcode

    def poll(self) -> Optional[int]:
        return self.process.exitcode

    def wait(self, timeout: Optional[float] = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired([sys.executable, *self.args], timeout)
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()


def start(
    args: List[str],
    cwd: str,
    env: Dict[str, str],
    stdout: str = os.devnull,
    stderr: str = os.devnull,
    new_session: bool = False,
    die_with_parent: bool = False,
) -> Child:
    """Start ``python ARGS`` forked from the server; its stdout and stderr go to the files named (the
    same file for both: one stream, as Popen's ``stderr=STDOUT``).
    ``new_session``: the child leads a session of its own (``os.killpg(child.pid, ...)`` reaches every
    process it starts), as Popen's ``start_new_session``; ``die_with_parent``: it is killed when its
    parent (the server, which ends with this process) dies."""
    ctx = context()
    proc = ctx.Process(
        target=_child,
        args=(list(args), str(cwd), dict(env), stdout, stderr, new_session, die_with_parent),
        daemon=False,
    )
    proc.start()
    return Child(list(args), proc)


def _child(
    args: List[str], cwd: str, env: Dict[str, str], out: str, err: str, new_session: bool, die_with_parent: bool
) -> None:
    """In the forked process: become ``python ARGS`` and run it."""
    _leave_the_server(new_session, die_with_parent)
    # the server's imports (torch's, torchvision's, torchmetrics' objects) out of every collection's walk,
    # as a run freezes what lives before its first job (trainer.run.job.freeze_long_lived_objects)
    gc.freeze()
    # multiprocessing's view of this process as a fresh interpreter has it: the main process, its
    # start method not chosen (a loader's workers fork, as they would, not through the server)
    process = sys.modules["multiprocessing.process"]  # (the package's name "process" is not this module)
    multiprocessing.set_start_method(None, force=True)
    me = process.current_process()
    me._name, me._identity, me._parent_pid, me._parent_name = "MainProcess", (), None, None
    process._parent_process = None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        if fd == 2 and path == out:  # one file for both, as Popen's stderr=STDOUT
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]  # runpy sets argv[0] to the module's file, as python -m does
            sys.path[0:0] = [cwd]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[0])
            sys.argv = [args[0], *args[1:]]
            sys.path[0:0] = [os.path.dirname(os.path.realpath(script))]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1

    threading._shutdown()  # as the interpreter's exit does: wait for threads that are not daemons,
    atexit._run_exitfuncs()  # then the exit handlers (multiprocessing ends its children with os._exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_the_server(new_session: bool, die_with_parent: bool) -> None:
    """The child's ties to the server: a session of its own, the server's "alive" pipe closed, and
    death with the server (which ends with the caller)."""
    server_pid = os.getppid()
    if new_session:
        os.setsid()
    # the server ends when every holder of its "alive" pipe has closed it: the caller, and every child
    # it serves, which inherits the pipe's write end. Closed here, the server ends with the caller.
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    if die_with_parent:
        set_parent_death_signal()
        if os.getppid() != server_pid:  # the server (and the caller) died before the signal was set
            os._exit(1)


def set_parent_death_signal() -> None:
    """SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG); elsewhere nothing."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
