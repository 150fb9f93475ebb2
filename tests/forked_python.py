"""``python train.py ...`` for the tests, without paying Python's start-up each time.

Why this exists: importing torch, torchvision, Lightning (and the torchmetrics it pulls in) and Hydra
takes about 5 s of one core before a command does anything; the suite runs ``train.py`` and
``python -m trainer....`` in a fresh interpreter a hundred times and more, so most of a short test's
time went there. ``run_python`` runs the command in a process forked from a server that has imported
the slowest of those libraries and nothing else (not ``trainer``, so every run's own modules start fresh): the
standard library's forkserver with a preload list. From there on the command runs as a fresh
``python`` would: ``sys.argv``, ``sys.path[0]``, the working dir and the environment are the
command's, stdout and stderr are files (not a terminal, as with ``capture_output``), ``__main__`` is the
script (or ``-m`` module), an uncaught exception prints its traceback and exits 1, ``sys.exit``'s
code is the exit code, and the interpreter's exit handlers run.

What a forked run cannot give: environment variables that the preloaded libraries read when they are
imported (OpenMP's and torch's, ``LD_PRELOAD``, a rank's ``RANK``...). A command whose environment
differs from the server's in anything but ``RUNTIME_ENV`` (variables read while running) runs in a
fresh interpreter instead, as does every command when ``TRAINER_TESTS_FRESH_PYTHON=1``
(``make test`` with it set checks that nothing depends on the fork); ``TRAINER_TESTS_FORK_LOG=FILE``
appends each command's choice and the variables that decided it. A test that signals, kills or
times a process starts its own with ``subprocess`` and never comes here.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from multiprocessing import forkserver
from typing import Dict, List, Optional

# what the server imports before it forks: the slow imports every trainer command makes (4 of its 5 s).
# Not Lightning or Hydra (0.4 s): what they set up at import depends on what ran before (Lightning
# gives its logger a stderr handler of its own only when the root logger has none yet).
PRELOAD = ["torch", "torchvision", "torchmetrics"]
# variables the product and its libraries read while running, not at import: a command may set these
RUNTIME_ENV = {
    "PYTEST_CURRENT_TEST",
    "TRAINER_CACHE",
    "TRAINER_CPU_FLAGS",
    "MLFLOW_TRACKING_URI",
    "WANDB_MODE",
    "WANDB_SILENT",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    # set by runs a test makes in-process before it starts a command (Lightning's seeding, torch.cuda's
    # device count, Inductor's cache): read when used, not at import
    "PL_GLOBAL_SEED",
    "PL_SEED_WORKERS",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "TORCHINDUCTOR_CACHE_DIR",
}
FRESH_ENV = "TRAINER_TESTS_FRESH_PYTHON"

_server_env: Optional[Dict[str, str]] = None
# the environment the server starts with: the tests' own before any test changed it (set_base_env)
_base_env: Optional[Dict[str, str]] = None


def set_base_env(env: Dict[str, str]) -> None:
    """The environment the server will have: a command's may differ from it only in ``RUNTIME_ENV``.
    Taken before the first test runs (conftest), so a variable one test sets while the server starts
    does not send every later command to a fresh interpreter."""
    global _base_env
    _base_env = dict(env)


def run_python(
    args: List[str], cwd, env: Dict[str, str], timeout: float = 600, fresh: bool = False
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
    timeout=timeout)``, forked from the preloaded server where that gives the same run (see above)."""
    if fresh or not _forkable(args, env):
        return subprocess.run(
            [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    ctx = _context(env)
    with tempfile.TemporaryDirectory(prefix="forked-python-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        proc = ctx.Process(target=_child, args=(list(args), str(cwd), dict(env), out, err), daemon=False)
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, _read(out), _read(err))
        return subprocess.CompletedProcess([sys.executable, *args], proc.exitcode, _read(out), _read(err))


def _forkable(args: List[str], env: Dict[str, str]) -> bool:
    if os.environ.get(FRESH_ENV) == "1" or not args or args[0].startswith("-") and args[0] != "-m":
        return False
    reference = _server_env or _base_env or env
    changed = {k for k in set(env) | set(reference) if env.get(k) != reference.get(k)}
    if os.environ.get("TRAINER_TESTS_FORK_LOG"):
        with open(os.environ["TRAINER_TESTS_FORK_LOG"], "a") as f:
            f.write(f"{'fork' if changed <= RUNTIME_ENV else 'fresh'} {sorted(changed - RUNTIME_ENV)} {args[:2]}\n")
    return changed <= RUNTIME_ENV


def _context(env: Dict[str, str]):
    """The forkserver context; the server starts (once per test process) with the base environment."""
    global _server_env
    ctx = multiprocessing.get_context("forkserver")
    if _server_env is None:
        env = _base_env or env
        ctx.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)  # the server's environment is ours when it starts
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _server_env = dict(env)
    return ctx


def _child(args: List[str], cwd: str, env: Dict[str, str], out: str, err: str) -> None:
    """In the forked process: become ``python ARGS`` and run it."""
    import atexit
    import runpy

    # multiprocessing's view of this process as a fresh interpreter has it: the main process, its
    # start method not chosen (a loader's workers fork, as they would, not through our server)
    process = sys.modules["multiprocessing.process"]  # (the package's name "process" is not this module)
    multiprocessing.set_start_method(None, force=True)
    me = process.current_process()
    me._name, me._identity, me._parent_pid, me._parent_name = "MainProcess", (), None, None
    process._parent_process = None
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
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
    import threading

    threading._shutdown()  # as the interpreter's exit does: wait for threads that are not daemons,
    atexit._run_exitfuncs()  # then the exit handlers (multiprocessing ends its children with os._exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
