"""The README is tested: every ``python train.py ...`` / ``python -m trainer....`` command in its code
blocks (and in the SPEC's command table, where this checkout has it) runs as written, shrunk to a
CPU-minute by one fixed suffix. A command that shows an error (``$ python train.py ampp=true`` then
``error: ...``) must stop with exactly that error and no traceback.

A comment ``[needs GPU]`` after a command marks it for a CUDA machine: it runs here as a GPU-marked
test (skipped without CUDA), so ``scripts/gpu_check.sh`` runs it. ``[needs Slurm]`` marks commands
for a Slurm cluster (tested with the cluster). Each command runs in a fresh dir holding a link to
``train.py``, with the README's example run dirs made there, so relative paths work as written.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest
from conftest import ROOT, clean_env
from forked_python import run_python

# appended to every command: any recipe at smoke scale, one short epoch of small batches (a bf16
# step of ResNet-50 is slow where a CPU only emulates bf16), no checkpoints
SMOKE = [
    "scale=smoke",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1",
    "data.batch_size=4",
    "checkpoint.enabled=false",
]
# and to a tune: the shortest probes, one candidate that a CPU skips (the search itself is tested in test_tune)
TUNE_SMOKE = ["tune.only=[pin_memory]", "tune.probe_batches=2", "tune.probe_epochs=3", "tune.verify_epochs=1"]
# the best.yaml the README's +tuned= example reads
TUNED_EXAMPLE = "outputs/tune/best.yaml"
MARKERS = {"[needs GPU]": "gpu", "[needs Slurm]": "slurm"}


class Command(NamedTuple):
    text: str  # as written
    source: str
    marker: Optional[str]
    expected_error: Optional[str]  # the README shows it failing with this message


def _code_blocks(text: str) -> List[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def readme_commands(path: Path = ROOT / "README.md") -> List[Command]:
    out: List[Command] = []
    for block in _code_blocks(path.read_text()):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            shown = line.startswith("$ ")
            cmd = line[2:] if shown else line
            if not re.match(r"python (train\.py|-m trainer\.)", cmd) or cmd.rstrip().endswith("\\"):
                continue  # (a command continued on the next line is not one this collector reads)
            comment = cmd.split("  #", 1)[1] if "  #" in cmd else ""
            marker = next((m for tag, m in MARKERS.items() if tag in comment), None)
            cmd = cmd.split("  #", 1)[0].strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            error = nxt[len("error: ") :].rstrip(". ").split(" ...")[0] if shown and nxt.startswith("error: ") else None
            out.append(Command(cmd, "README.md", marker, error))
    return out


def spec_commands(path: Path = ROOT.parent / "shared" / "SPEC.md") -> List[Command]:
    """The SPEC's command table, placeholders filled in (DIR, SRC, DST) and optional parts dropped."""
    if not path.exists():
        return []
    out = []
    for cmd in re.findall(r"^\| `(python [^`]+)` \|", path.read_text(), flags=re.M):
        cmd = (
            re.sub(r"\s*\[[^\]]*\]", "", cmd).replace(" ...", "").strip()
        )  # [DIR ...], [--format parquet], [overrides]
        marker = "slurm" if "launcher=slurm" in cmd else None
        out.append(Command(cmd, "SPEC.md", marker, None))
    return out


def _demo_command() -> str:
    recipe = re.search(r"^demo:.*\n\t\$\(PY\) (.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe, "no demo target in the Makefile"
    return f"python {recipe.group(1).strip()}"


def _commands() -> List[Command]:
    seen, out = set(), []
    for c in readme_commands() + spec_commands():
        if c.text not in seen and c.text != _demo_command():  # run unshrunk by its own test below
            seen.add(c.text)
            out.append(c)
    return out


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def _slurm_problem():
    from test_slurm import cluster_problem

    return cluster_problem()


def _param(c: Command):
    marks = {
        "gpu": [
            pytest.mark.gpu,
            pytest.mark.skipif(not _cuda(), reason="[needs GPU]: scripts/gpu_check.sh runs it on a CUDA machine"),
        ],
        "slurm": [
            pytest.mark.slurm,
            pytest.mark.skipif(_slurm_problem() is not None, reason=f"[needs Slurm]: {_slurm_problem()}"),
        ],
    }.get(c.marker, [])
    if "logger=" in c.text:
        marks = [*marks, pytest.mark.xdist_group("trackers")]  # with the tracker tests: one MLflow server
    if "compile=" in c.text:
        marks = [*marks, pytest.mark.heavy]  # the longest of these tests: started first
    return pytest.param(c, id=f"{c.source}: {c.text}", marks=[pytest.mark.slow, *marks])


def _fake_job(sweep: Path, job: str, flags: dict, times: List[float]) -> None:
    (sweep / job).mkdir(parents=True)
    epochs = [
        {
            "epoch": i,
            "time_s": t,
            "samples": 64,
            "samples_per_s": 64 / t,
            "data_wait_s": 0.0,
            "transfer_s": 0.0,
            "steps": 8,
            "warmup": i == 0,
        }
        for i, t in enumerate(times)
    ]
    m = {
        "schema": 1,
        "status": "ok",
        "error": None,
        "recipe": "resnet50",
        "flags": {"amp": False, "compile": False, **flags},
        "device": {"accelerator": "cpu", "name": "x", "count": 1},
        "epochs": epochs,
        "epoch_time_s": sorted(times[1:])[len(times[1:]) // 2],
        "samples_per_s": 64 / times[-1],
        "data_wait_fraction": 0.0,
        "transfer_fraction": 0.0,
        "peak_memory_mb": 1.0,
        "train_loss": 1.0,
        "val_acc": 0.5,
    }
    (sweep / job / "metrics.json").write_text(json.dumps(m))


def _workdir(tmp_path: Path) -> Path:
    """A fresh dir to run in: train.py linked, the README's example inputs made (report dirs, an image folder)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").symlink_to(ROOT / "train.py")
    _fake_job(work / "multirun/2026-11-22/10-00-00", "0", {}, [2.0, 1.0, 1.0])
    _fake_job(work / "multirun/2026-11-23/09-30-00", "0", {"amp": True}, [2.0, 0.5, 0.5])
    (work / TUNED_EXAMPLE).parent.mkdir(parents=True)
    (work / TUNED_EXAMPLE).write_text('overrides:\n  - "channels_last=true"\n')
    from PIL import Image

    for c in range(2):
        (work / "SRC" / f"class{c}").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (24, 24), (100 * c, 30 * i, 60)).save(work / "SRC" / f"class{c}" / f"{i}.jpg")
    return work


def _args(c: Command) -> List[str]:
    args = shlex.split(c.text)[1:]  # drop "python"
    if c.marker == "gpu":  # "8 GPUs" in the README: as many as this GPU machine has
        import torch

        args = [
            f"devices={min(int(a.split('=')[1]), torch.cuda.device_count())}"
            if a.startswith("devices=") and a.split("=")[1].isdigit()
            else a
            for a in args
        ]
    if "hydra.launcher.partition=P" in args:  # the SPEC's placeholder: the local test cluster (CPU only)
        args = [a for a in args if a != "hydra.launcher.partition=P"]
        args = ["hydra/launcher=slurm_local" if a == "hydra/launcher=slurm" else a for a in args]
    if args[:2] == ["-m", "trainer.report"]:
        return [*args[:2], *[("multirun/2026-11-22/10-00-00" if a == "DIR" else a) for a in args[2:]]]
    if args[:2] == ["-m", "trainer.pack"]:
        return args + (["--size", "16"] if "--format" not in args or "npy" in args else [])
    if args[:2] == ["-m", "trainer.tune"]:
        return args + SMOKE + TUNE_SMOKE + ["hydra.run.dir=run"]
    if args[0] == "train.py" and c.expected_error is None:
        # the suffix's sizes replace any the command gives (the demo's six epochs); other keys as written
        sizes = {s.split("=", 1)[0]: s for s in SMOKE if s.startswith("trainer.")}
        if "compile=true" in c.text or "compile=false,true" in c.text:
            # The recipe's network through torch.compile's graph capture (dynamo, AOT autograd: forward
            # and backward, under amp) with the aot_eager backend: Inductor's code generation for a
            # ResNet-50 takes 60-100 s per cold graph on one core, three graphs here, and what it
            # generates is torch's (Inductor itself, its caches and the compile time it reports are
            # tested on small conv nets in test_switches.py and by the GPU check's compile rows). No
            # validation: its eval-mode graph would be one more capture.
            sizes["trainer.limit_val_batches"] = "trainer.limit_val_batches=0"
            sizes["compile_backend"] = "compile_backend=aot_eager"
        args = [sizes.get(a.split("=", 1)[0], a) for a in args]
        given = {a.split("=", 1)[0] for a in args}
        suffix = [sizes.get(s.split("=", 1)[0], s) for s in SMOKE if s.split("=", 1)[0] not in given]
        suffix += [v for k, v in sizes.items() if k == "compile_backend" and k not in given]
        return args + suffix + (["hydra.sweep.dir=sweep"] if "-m" in args else ["hydra.run.dir=run"])
    return args


@pytest.mark.parametrize("command", [_param(c) for c in _commands()])
def test_the_command_runs_as_written(command: Command, tmp_path, request):
    if command.expected_error and "GPU" in command.expected_error:
        import torch

        if torch.cuda.is_available():
            pytest.skip("the README shows this error for a machine with no GPU")
    work = _workdir(tmp_path)
    # the environment the README's Tracking section sets up: a tracking server, W&B offline
    env = clean_env(WANDB_MODE="offline", WANDB_SILENT="true")
    if re.search(r"logger=\S*(mlflow|many)", command.text):
        env["MLFLOW_TRACKING_URI"] = request.getfixturevalue("mlflow_server").uri
    r = run_python(_args(command), work, env, timeout=600)
    out = r.stdout + r.stderr
    if command.expected_error:
        assert r.returncode == 2, out[-3000:]
        assert f"error: {command.expected_error}" in r.stderr, (command.expected_error, r.stderr[-2000:])
    else:
        assert r.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    for metrics in (work / "run", work / "sweep"):
        for path in metrics.rglob("metrics.json") if metrics.exists() else []:
            assert json.loads(path.read_text())["status"] == "ok", path


@pytest.mark.slow
@pytest.mark.heavy  # a minute on one core: started first
def test_the_demo_learns_what_the_readme_says(tmp_path):
    """The demo's command as written, not shrunk (the README test above runs every other command
    shrunk, and leaves this one to here): four jobs, every one learning to about 0.99 val_acc (the
    README's words; 0.95 allows one seed's spread on another CPU), and the table marks each time-to-
    target ratio as one run's, not as a judged result."""
    command = _demo_command()
    work = _workdir(tmp_path)
    r = run_python([*shlex.split(command)[1:], "hydra.sweep.dir=sweep"], work, clean_env(), timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out[-4000:]
    paths = sorted((work / "sweep").glob("*/metrics.json"))
    assert len(paths) == 4, out[-3000:]
    for path in paths:
        job = json.loads(path.read_text())
        assert job["status"] == "ok" and len(job["epochs"]) == 6, (path, job["status"])
        assert job["val_acc"] >= 0.95, (path, job["val_acc"])
    # the decoder's speed-up is a measurement (scripts/results/demo/), not asserted here; what is: every
    # row's epoch-time ratio is judged (an interval over its epochs), the ratio the README quotes
    import csv

    rows = list(csv.DictReader((work / "sweep" / "ab_report.csv").open()))
    others = [r for r in rows if r["notes"].split(";")[0] != "baseline"]
    assert len(rows) == 4 and len(others) == 3 and all(r["speedup_ci"] for r in others), rows
    # every other row reached the target and its ratio is marked as one run's, in the files and the console
    assert [r["time_to_target_ci_holds"] for r in others] == ["not judged"] * 3, others
    console = out.replace("\xa0", " ")  # the table joins a cell's words with no-break spaces
    table = console[: console.rindex("report: ")]
    assert sum(line.count("(1 run)") for line in table.splitlines() if re.match(r"\d+\s", line)) == 3, table


def test_make_demo_runs_the_command_the_readme_shows():
    assert _demo_command() in [c.text for c in readme_commands()]


# what only the tests use: none of it may reach `make demo`'s install (a newcomer's first command
# should not download a GPU data-loading library, a tracking server's client or an S3 mock)
TEST_ONLY = {
    "nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13", "mlflow-skinny", "wandb", "moto", "s3fs", "pyarrow", "webdataset", "pytest",
    "pytest-xdist", "ruff", "import-linter", "py-spy", "hydra-submitit-launcher",
}  # fmt: skip


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_closure(requirements: List[str]) -> set:
    """The distributions these requirement strings pull in, through the installed packages' own
    metadata (markers evaluated, extras followed): what `pip install` of them installs."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen, todo = set(), [(r, frozenset()) for r in requirements]
    while todo:
        text, extras = todo.pop()
        req = Requirement(text)
        env_extras = extras or {""}
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in env_extras):
            continue
        name = _canonical(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [(r, frozenset(req.extras)) for r in requires]
    return {name for name, _ in seen}


def test_the_demos_install_pulls_in_nothing_only_the_tests_need():
    """`make demo` installs the runtime dependencies and the extras its Makefile target names
    (DEMO_EXTRAS), not the tests' [test]; every package those pull in, followed through the installed
    packages' metadata, is outside TEST_ONLY (DALI, MLflow, moto, ...), and [test] holds them all."""
    import tomllib

    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo: setup-demo$", makefile, flags=re.M), "make demo must install with setup-demo"
    extras = re.search(r"^DEMO_EXTRAS := (.*)$", makefile, flags=re.M).group(1).split()
    demo_install = re.search(r"^\$\(VENV\)/\.installed-demo:.*\n(?:\t.*\n)*", makefile, flags=re.M).group(0)
    assert "'.[$(DEMO_EXTRAS)]'" in demo_install and "[test]" not in demo_install
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    pulled = _installed_closure(requirements)
    assert {"torch", "pytorch-lightning", "hydra-core", "simplejpeg"} <= pulled  # the closure is really walked
    assert not pulled & TEST_ONLY, sorted(pulled & TEST_ONLY)
    test_extra = {_canonical(re.split(r"[<>=\[]", r)[0]) for r in project["optional-dependencies"]["test"]}
    # every package [test] names that the demo does not pull in is in TEST_ONLY: a new test-only
    # dependency is checked here without being listed by hand first
    assert test_extra - pulled == TEST_ONLY, (test_extra - pulled) ^ TEST_ONLY


def test_the_readme_has_the_commands_this_test_expects():
    """The collector itself can fail: it finds the quickstart commands, the errors and the markers."""
    found = readme_commands()
    texts = [c.text for c in found]
    assert "python train.py +recipe=resnet50 amp=true compile=true" in texts
    assert "python train.py -m +recipe=resnet50 amp=false,true compile=false,true" in texts
    assert any(c.expected_error and c.expected_error.startswith("Unknown config key 'ampp'") for c in found)
    assert any(c.marker == "gpu" for c in found) and any(c.marker == "slurm" for c in found)
    assert len(found) >= 12


def test_tab_completion_as_the_readme_installs_it(tmp_path):
    """The README's bash completion, installed with its eval line and asked the way bash asks."""
    line = next(
        line
        for block in _code_blocks((ROOT / "README.md").read_text())
        for line in block.splitlines()
        if "-sc install=bash" in line
    )
    install = line.split("  #", 1)[0].strip()
    script = f"""
{install}
complete_for() {{
    COMP_LINE="$1"; COMP_POINT=${{#COMP_LINE}}; read -r -a COMP_WORDS <<< "$COMP_LINE"
    COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMPREPLY=(); hydra_bash_completion; echo "${{COMPREPLY[*]}}"
}}
complete_for "python train.py am"
complete_for "python train.py +recipe="
"""
    env = clean_env(PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]]))
    r = subprocess.run(
        ["bash", "-c", script], cwd=_workdir(tmp_path), env=env, capture_output=True, text=True, timeout=120
    )
    keys, recipes = r.stdout.strip().splitlines()[-2:]
    assert set(keys.split()) == {"amp=", "amp_dtype="}, r.stdout + r.stderr
    shipped = {f"+recipe={p.stem}" for p in (ROOT / "recipes").glob("*.yaml")}
    assert {"+recipe=resnet50", "+recipe=vit", "+recipe=vit_deit"} <= shipped, shipped
    assert set(recipes.split()) == shipped, r.stdout + r.stderr
