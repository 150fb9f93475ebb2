"""``python train.py ...`` for the tests, without paying Python's start-up each time.

The suite runs ``train.py`` and ``python -m trainer....`` a hundred times and more, and importing torch,
torchvision and the torchmetrics Lightning pulls in took most of a short test's time. ``run_python``
forks each command from the product's preloaded server (``trainer/launch/preloaded.py``, which the tuner's
probes use too; it says what a forked command gets and what it cannot), under the tests' own rule,
stricter than the product's: a command whose environment differs from the server's in anything but
``RUNTIME_ENV`` (variables read while running) runs in a fresh interpreter, as does every command
when ``TRAINER_TESTS_FRESH_PYTHON=1`` (``make test`` with it set checks that nothing depends on the
fork); ``TRAINER_TESTS_FORK_LOG=FILE`` appends each command's choice and the variables that decided
it. A test that signals or kills a command it started in the background uses ``start_python``: the
same rule, and a handle with the parts of ``subprocess.Popen`` those tests use.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from trainer.launch import preloaded

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
    from hang_report import end_hung

    with tempfile.TemporaryDirectory(prefix="forked-python-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        if fresh or not _forkable(args, env):
            with open(out, "w") as o, open(err, "w") as e:
                child = subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=o, stderr=e, text=True)
        else:
            preloaded.context(_base_env or env)  # the server starts (once per test process) with the base environment
            child = preloaded.start(list(args), str(cwd), dict(env), out, err)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            # what every process under it was doing goes to the failure report; then the whole tree ends
            try:
                end_hung(child.pid, list(args), cwd)
            finally:
                if child.poll() is None:  # (end_hung killed it; its pid is not to be signalled again)
                    child.kill()
                child.wait()
            raise subprocess.TimeoutExpired([sys.executable, *args], timeout, _read(out), _read(err)) from None
        except BaseException:  # Ctrl-C, or anything else while waiting: the command ends too (as subprocess.run)
            child.kill()
            child.wait()
            raise
        return subprocess.CompletedProcess([sys.executable, *args], child.returncode, _read(out), _read(err))


class Started:
    """A command forked from the preloaded server, as ``subprocess.Popen([sys.executable, *args],
    stdout=PIPE, stderr=STDOUT, text=True)`` would run it: ``pid``, ``poll``, ``wait``, ``returncode``,
    ``send_signal``, ``kill`` and ``communicate`` (its output, stdout and stderr as one text, read from
    the file it writes)."""

    def __init__(self, child, tmp: tempfile.TemporaryDirectory, output: str) -> None:
        self.child, self._tmp, self._output = child, tmp, output
        self.pid = child.pid
        self.args = child.args

    @property
    def returncode(self) -> Optional[int]:
        return self.child.returncode

    def poll(self) -> Optional[int]:
        return self.child.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        return self.child.wait(timeout)

    def send_signal(self, signum: int) -> None:
        if self.child.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # ended in between (Popen.send_signal ignores it too)
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: Optional[float] = None):
        self.wait(timeout)
        out = _read(self._output)
        self._tmp.cleanup()
        return out, None


def start_python(args: List[str], cwd, env: Dict[str, str], new_session: bool = False):
    """``subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=PIPE, stderr=STDOUT,
    text=True, start_new_session=new_session)``, forked from the preloaded server where that gives the
    same run (``run_python``'s rule): for a test that signals or kills the command while it runs."""
    if not _forkable(args, env):
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=new_session,
        )
    preloaded.context(_base_env or env)
    tmp = tempfile.TemporaryDirectory(prefix="forked-python-")
    output = os.path.join(tmp.name, "output")
    child = preloaded.start(list(args), str(cwd), dict(env), output, output, new_session=new_session)
    _started.append(child)
    return Started(child, tmp, output)


# the commands start_python forked: a test that fails while one still runs (a stop that hangs) leaves
# it to end_leftovers, not to the pytest process's exit, which would wait for it (multiprocessing
# joins the children it started)
_started: list = []


def end_leftovers() -> None:
    """SIGKILL every command start_python forked that still runs (after each test: conftest)."""
    while _started:
        child = _started.pop()
        if child.poll() is None:
            child.kill()
            child.wait(30)


def _forkable(args: List[str], env: Dict[str, str]) -> bool:
    if os.environ.get(FRESH_ENV) == "1" or not args or args[0].startswith("-") and args[0] != "-m":
        return False
    reference = preloaded.server_env() or _base_env or env
    changed = {k for k in set(env) | set(reference) if env.get(k) != reference.get(k)}
    if os.environ.get("TRAINER_TESTS_FORK_LOG"):
        with open(os.environ["TRAINER_TESTS_FORK_LOG"], "a") as f:
            f.write(f"{'fork' if changed <= RUNTIME_ENV else 'fresh'} {sorted(changed - RUNTIME_ENV)} {args[:2]}\n")
    return changed <= RUNTIME_ENV


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
