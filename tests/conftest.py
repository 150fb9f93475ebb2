"""Shared fixtures: configs composed in-process exactly as train.py composes them, and tiny runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

# Small enough for 2 CPU cores: 16 px images, a handful of steps, no checkpoints.
TINY = [
    "data.image_size=16",
    "data.batch_size=8",
    "data.num_samples=64",
    "data.val_samples=16",
    "trainer.max_epochs=1",
    "trainer.log_every_n_steps=1",
    "checkpoint.enabled=false",
]


def pytest_configure(config):
    """Under pytest-xdist (``make test``'s parallel part), each worker gets its own share of the CPUs
    (its processes inherit it): the trainer reads its affinity mask as the machine it has, so a
    worker's runs neither compete with the other's nor see its load as "other processes". Tests
    that need every core (several processes, or a machine-wide measurement) are marked
    ``whole_machine`` and run afterwards, alone."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker and count > 1 and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= count:
            os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % count :: count])


def pytest_collection_modifyitems(config, items):
    """The ``heavy`` tests first (a stable sort: the rest keep their order). pytest-xdist hands tests
    out in collection order, so a long test collected last ran alone at the end while the other
    worker idled (the two tune tests, two minutes of the parallel part's wall time)."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)


def pytest_report_header(config):
    """The machine in the suite's header: a slow run reads differently on a CPU that emulates bf16."""
    from trainer.measure.hardware import cpu_kind, detect

    hw = detect("cpu")
    bf16 = "native bf16" if hw.bf16_native else "no native bf16: amp tests keep to tiny models"
    return f"machine: {hw.name}, {hw.cpu_cores} usable cores, {cpu_kind()} ({bf16})"


@pytest.fixture(scope="session", autouse=True)
def _forked_python_env():
    """The environment the tests' forked ``python`` starts with (forked_python.py): the session's,
    after collection (importing torch sets a few variables) and before any test changes it."""
    from forked_python import set_base_env

    set_base_env(clean_env())


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # one builtin-dataset cache per test session, never the user's ~/.cache
    monkeypatch.setenv("TRAINER_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def clear_spies():
    """An empty spies.SEEN before and after the test (tests that read ProbeNet's snapshots)."""
    import spies

    spies.SEEN.clear()
    yield
    spies.SEEN.clear()


@pytest.fixture
def compose():
    """What ``python train.py OVERRIDES`` would run, composed in-process."""
    from trainer.config.compose import compose_for_run

    return lambda *overrides: compose_for_run(overrides)


@pytest.fixture
def train(tmp_path, compose):
    """Run one tiny job in-process; returns (metrics, run_dir)."""
    from trainer.run import run

    counter = {"n": 0}

    def _train(*overrides: str, tiny: bool = True):
        counter["n"] += 1
        out = tmp_path / f"run{counter['n']}"
        args = (TINY if tiny else []) + list(overrides)
        return run(compose(*args), str(out), args), out

    return _train


@pytest.fixture
def add_callbacks(monkeypatch):
    """``add_callbacks(cb, ..., first=False)``: every run of this test gets these callbacks too (after the
    trainer's own, or before them with ``first=True``), through the one place callbacks are built."""
    from trainer.run import build as run_build  # where the job looks build_callbacks up

    real = run_build.build_callbacks

    def _add(*callbacks, first: bool = False) -> None:
        def with_callbacks(parts):
            found = real(parts)
            found.all = [*callbacks, *found.all] if first else [*found.all, *callbacks]
            return found

        monkeypatch.setattr(run_build, "build_callbacks", with_callbacks)

    return _add


@pytest.fixture
def fake_gpu(monkeypatch):
    """Make torch.cuda answer as one GPU of a given kind would, and return what ``hardware.detect``
    makes of it. bf16 is answered as torch answers it: emulated bf16 counts as supported unless
    ``including_emulation=False`` (native from sm80). Only the questions detect() asks are faked:
    nothing may run on this "GPU"."""
    import torch

    from trainer.measure import hardware

    def _fake(name: str, capability: tuple, count: int = 1):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
        monkeypatch.setattr(
            torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation or capability[0] >= 8
        )
        hardware.detect.cache_clear()
        return hardware.detect("auto")

    yield _fake
    hardware.detect.cache_clear()


# set by Lightning when a test runs DDP in-process; a child must not think it is already a rank
DISTRIBUTED_ENV = (
    "LOCAL_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    # what srun and this framework's launcher set: a test's run is none of their ranks
    "SLURM_STEP_ID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_NTASKS_PER_NODE",
    "TRAINER_LAUNCHED_RANKS",
)


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    # the tests' and the project's folders first; then the caller's own (packages installed with
    # pip --target, as on a GPU machine that keeps its own torch, are found only through it)
    paths = [str(TESTS), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(PYTHONPATH=os.pathsep.join(paths), **extra)
    return env


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """The stop signals' handlers as they were before the test: a run made in-process installs the
    trainer's, and a process forked later (a multiprocessing Pool's worker) would inherit one that
    does not end it on SIGTERM, so ``Pool.terminate`` waited on it forever."""
    import signal

    names = ("SIGTERM", "SIGINT", "SIGUSR1")
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names if hasattr(signal, name)}
    yield
    for name, handler in saved.items():
        if handler is not None:
            signal.signal(getattr(signal, name), handler)


@pytest.fixture(autouse=True)
def _no_forked_command_outlives_its_test():
    """A background command a test forked (forked_python.start_python) and left running, because the
    test failed before it ended, is killed when the test ends."""
    yield
    from forked_python import end_leftovers

    end_leftovers()


@pytest.fixture(autouse=True)
def _restore_environment():
    """os.environ as it was before the test: a run made in-process sets variables (Lightning: the
    ranks' RANK..., PL_GLOBAL_SEED, and OMP_NUM_THREADS for DDP; Inductor its own) that would
    otherwise reach every later test's processes, which then depended on the order tests ran in."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run_cli(*args: str, cwd=None, timeout: int = 600, env_extra=None) -> subprocess.CompletedProcess:
    """Run train.py as a user would, in a process of its own (forked_python says how it starts)."""
    from forked_python import run_python

    return run_python([str(ROOT / "train.py"), *args], cwd or ROOT, clean_env(**(env_extra or {})), timeout)


def read_metrics(run_dir) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def final_loss(ckpt, width: int = 8, image_size: int = 16, batchnorm: bool = True) -> float:
    """The loss of a TinyCNN checkpoint's weights on one fixed batch: equal weights, equal losses."""
    import torch

    from trainer.models.tiny import TinyCNN

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    net = TinyCNN(num_classes=10, width=width, batchnorm=batchnorm)
    net.load_state_dict({k.removeprefix("net."): v for k, v in state.items()})
    net.eval()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, image_size, image_size, generator=g), torch.randint(0, 10, (64,), generator=g)
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(net(x), y))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 (authentication on), for the whole session; stopped by PID."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (pip install -e '.[test]')")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install -e '.[test]')")
    from s3server import S3Server

    server = S3Server(tmp_path_factory.getbasetemp() / "moto.log")
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The S3 server with its AWS_* variables set for this test (and the processes it starts)."""
    import s3fs

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()  # fsspec caches filesystems by arguments, not by environment
    yield s3_server
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def small_images(tmp_path_factory):
    """The built-in real JPEGs, small: 10 classes, train/ (20 each) and val/ (5 each), 40 px."""
    from trainer.data.builtin import ensure_builtin

    return ensure_builtin(str(tmp_path_factory.getbasetemp() / "small-images"), 20, 40)


@pytest.fixture(scope="session")
def one_per_class(tmp_path_factory):
    """23 classes of one training image each (and one validation image): a label names its file."""
    from PIL import Image

    root = tmp_path_factory.mktemp("one-per-class")
    for c in range(23):
        for split in ("train", "val"):
            (root / split / f"c{c:02d}").mkdir(parents=True)
            Image.new("RGB", (20, 20), (10 * c, 255 - 10 * c, 60)).save(root / split / f"c{c:02d}" / "0.png")
    return root


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1 (SQLite, local artifacts) for the session; stopped by PID."""
    pytest.importorskip("mlflow", reason="the tracker tests need mlflow-skinny (pip install -e '.[test]')")
    from mlflow_server import MlflowServer, executable

    mlflow = executable()
    if mlflow is None:
        pytest.skip("no MLflow server here: make test builds .venv-mlflow-server (or set TRAINER_TEST_MLFLOW_SERVER)")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"), mlflow)
    yield server
    server.stop()
