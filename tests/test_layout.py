"""The package's layout as users and CI rely on it.

Every module path a user is told about (``python -m trainer.X``, a console script, a ``_target_``
in the README, the docs or the configs, a ``from trainer... import`` in the docs, a ``trainer/...py``
file named there) resolves; the layers stated in pyproject.toml's ``[tool.importlinter]`` hold,
while an import planted against them breaks them (so ``make lint`` can fail); and the modules that
answer before a job starts still import no torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.paths import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = [*sorted((ROOT / "configs").rglob("*.yaml")), *sorted((ROOT / "recipes").glob("*.yaml"))]
# the scripts (not their committed results, which record what ran then)
SCRIPTS = sorted(
    p for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sh", ".sbatch") and "results" not in p.parts
)
# the commands whose module paths users run (the README names the first three; the launcher the last)
COMMANDS = ("trainer.pack", "trainer.report", "trainer.tune", "trainer.torchrun")
# what runs before a job starts (--help, a refused command line, a report, pack's checks): no torch at
# import, so they answer in well under a second (trainer/__init__.py's docstring names them)
LIGHT = (
    "trainer.errors",
    "trainer.paths",
    "trainer.rank",
    "trainer.config",
    "trainer.measure.metrics",
    "trainer.console",
    "trainer.launch.run_dirs",
    "trainer.command_line",
    "trainer.report",
    "trainer.sweep",
    "trainer.tune.app",
    "trainer.cli",
    "trainer.pack",
    "trainer.torchrun",
    # imported on those paths after the start: composing the config (--cfg job), a job's exit
    # (leave_process_group) and its launch, tune's journal
    "trainer.config.compose",
    "trainer.launch.processes",
    "trainer.launch.preloaded",
    "trainer.tune.probe",
    # processes that never train: the tuner's own (its probes train), the built-in set's cutting processes
    "trainer.tune.search",
    "trainer.tune.output",
    "trainer.tune.candidates",
    "trainer.data.builtin",
    "trainer.measure.hardware",
)

_COMMAND = re.compile(r"python -m (trainer[\w.]*)")
_TARGET = re.compile(r"(?:_target_\s*[:=]|\(\):)\s*['\"]?(trainer\.[\w.]+)")
_IMPORT = re.compile(r"from (trainer[\w.]*) import (\w+)")
_FILE = re.compile(r"(?<![\w/])(trainer/[\w/]+\.py)")
# docs/architecture.md's tables: `data/datamodule.py` `ImageDataModule._workers` (a file under trainer/, a name in it)
_FILE_NAME = re.compile(r"`((?:trainer/)?[\w/]+\.py)` `([A-Za-z_][\w.]*)`")


def _texts(paths):
    return [p.read_text() for p in paths]


def documented_paths() -> dict:
    """What the README, docs and configs tell users about: commands, targets, imports, files."""
    import tomllib  # Python 3.11+: here, so that collecting this file works on 3.10

    found = {"commands": set(COMMANDS), "targets": set(), "imports": set(), "files": set(), "names": set()}
    for text in _texts(DOCS):
        found["names"] |= {
            (file if file.startswith("trainer/") else f"trainer/{file}", name)
            for file, name in _FILE_NAME.findall(text)
        }
    for text in _texts(DOCS + CONFIGS):
        found["commands"] |= set(_COMMAND.findall(text))
        found["targets"] |= set(_TARGET.findall(text))
        found["imports"] |= set(_IMPORT.findall(text))
    for text in _texts(DOCS + CONFIGS + SCRIPTS):
        found["files"] |= set(_FILE.findall(text))
    found["scripts"] = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values())
    return found


def _resolve(dotted: str):
    """``a.b.C`` -> the object: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and not name.startswith(e.name):
                raise  # the module exists but one of its own imports is missing
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_scan_finds_what_users_are_told():
    """The patterns below match the documented paths (so the next test cannot pass on an empty scan)."""
    found = documented_paths()
    assert {"trainer.examples.MyNet", "trainer.examples.MyLightningModule", "trainer.models.tiny.TinyCNN"} <= found[
        "targets"
    ]
    assert "trainer.sweep.SweepCallback" in found["targets"]  # Hydra's callback, in configs/train.yaml
    assert {"trainer.pack", "trainer.report", "trainer.tune"} <= found["commands"]
    assert {"trainer.cli:main", "trainer.report:main", "trainer.pack:main", "trainer.tune.app:main"} <= found["scripts"]
    assert "trainer/launch/slurm.py" in found["files"]  # named in docs and in scripts/slurm/train.sbatch
    assert ("trainer/data/datamodule.py", "ImageDataModule._workers") in found["names"]  # docs/architecture.md


def test_every_documented_path_resolves():
    found = documented_paths()
    missing = []
    for command in sorted(found["commands"]):
        spec = importlib.util.find_spec(command)
        runnable = spec is not None and (
            spec.submodule_search_locations is None or importlib.util.find_spec(command + ".__main__") is not None
        )
        if not runnable:
            missing.append(f"python -m {command}")
    for script in sorted(found["scripts"]):
        module, _, function = script.partition(":")
        if not callable(getattr(importlib.import_module(module), function, None)):
            missing.append(f"console script {script}")
    for target in sorted(found["targets"]):
        try:
            _resolve(target)
        except (ImportError, AttributeError) as e:
            missing.append(f"_target_ {target} ({e})")
    for module, name in sorted(found["imports"]):
        if not hasattr(importlib.import_module(module), name):
            missing.append(f"from {module} import {name}")
    for file in sorted(found["files"]):
        if not (ROOT / file).is_file():
            missing.append(file)
    for file, name in sorted(found["names"]):
        try:
            _resolve(file[: -len(".py")].replace("/", ".").removesuffix(".__init__") + "." + name)
        except (ImportError, AttributeError) as e:
            missing.append(f"{file} {name} ({e})")
    assert missing == []


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter on the package under ``root``, with the contracts of pyproject.toml (as make lint runs it)."""
    tool = Path(sys.executable).parent / "lint-imports"
    if not tool.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(root)}
    return subprocess.run(
        [str(tool), "--config", "pyproject.toml", "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_hold():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


# (file to plant in, what it imports or None for a new module there, what the broken contract names)
PLANTED = {
    "measuring imports the entry point": ("measure/metrics.py", "from trainer.cli import main", "trainer.measure.metrics -> trainer.cli"),
    "the report imports the models": ("report/rows.py", "from trainer.models import build", "trainer.report is not allowed to import trainer.models"),
    "a tracker imports the models": ("tracking/record.py", "from trainer.models import build", "trainer.tracking is not allowed to import trainer.models"),
    "the data imports one run": ("data/folder.py", "from trainer.run import job", "trainer.data is not allowed to import trainer.run"),
    "a new part in no layer": ("newpart.py", None, "trainer.newpart"),
}  # fmt: skip


def test_an_import_against_the_contracts_breaks_them(tmp_path):
    """Each rule can fail: on a copy of the package (clean as it is), an import planted against each
    contract (and a module no layer holds) breaks make lint, and the broken contracts name each one."""
    root = tmp_path / "copy"
    shutil.copytree(ROOT / "trainer", root / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    assert _lint_imports(root).returncode == 0  # the copy itself is clean
    for where, planted, _ in PLANTED.values():
        path = root / "trainer" / where
        if planted is None:
            path.write_text('"""A part placed in no layer."""\n')
        else:
            path.write_text(path.read_text() + f"\n\ndef _planted():\n    {planted}\n\n    return None\n")
    r = _lint_imports(root)
    assert r.returncode != 0, r.stdout[-3000:]
    missed = [case for case, (_, _, named) in PLANTED.items() if named not in r.stdout]
    assert missed == [], r.stdout[-5000:]


def test_what_answers_before_a_job_imports_no_torch():
    """Each module in turn, in one fresh interpreter: the first that pulls torch (or Lightning) in is named."""
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT!r}:\n"
        "    importlib.import_module(name)\n"
        "    heavy = sorted({'torch', 'pytorch_lightning'} & set(sys.modules))\n"
        "    if heavy:\n"
        "        sys.exit(f'{name} imports {heavy}')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]


def unexplained_imports_in_functions(source: str) -> list:
    """The line numbers of imports inside a function that do not say why they are there: a comment on
    the line or on the line above (``# lazy: ...``, ``# here: ...``), a ``try`` around them (an
    optional dependency), or a place in a group of imports whose first one says it."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        ancestors, up = [], node
        while up in parent:
            up = parent[up]
            ancestors.append(up)
        functions = [a for a in ancestors if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not functions:
            continue
        inside = ancestors[: ancestors.index(functions[0])]
        said = (
            any(isinstance(a, ast.Try) for a in inside)
            or "#" in lines[node.end_lineno - 1]
            or lines[node.lineno - 2].strip().startswith("#")
        )
        siblings = getattr(parent[node], "body", [])
        at = siblings.index(node) if node in siblings else 0
        grouped = at > 0 and isinstance(siblings[at - 1], (ast.Import, ast.ImportFrom))
        if not said and not (grouped and siblings[at - 1].lineno not in found):
            found.append(node.lineno)
    return found


def test_imports_inside_functions_say_why():
    """Imports sit at the top of a module; one inside a function says why on its line (trainer/__init__.py)."""
    unexplained = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "trainer").rglob("*.py"))
        if (lines := unexplained_imports_in_functions(path.read_text()))
    }
    assert unexplained == {}


def test_an_unexplained_import_in_a_function_is_found():
    source = (
        "import os\n\n\n"
        "def f():\n"
        "    # lazy: keeps torch out of the start-up\n"
        "    import torch\n"
        "    import torch.nn\n\n"
        "    try:\n"
        "        import simplejpeg\n"
        "    except ImportError:\n"
        "        pass\n"
        "    import json\n"
        "    return json\n"
    )
    assert unexplained_imports_in_functions(source) == [13]


def test_one_run_never_calls_back_up_a_layer():
    """Followed through one tiny run (scripts/trace_run_parts.py), no part calls code of a part above it
    or beside it directly, and nothing calls into ``run`` from below, even through Lightning (no callback
    calls back into run). What the run does not take is not seen: a GPU's paths, other data formats."""
    spec = importlib.util.spec_from_file_location("trace_run_parts", ROOT / "scripts" / "trace_run_parts.py")
    tracer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tracer)
    traced = tracer.trace(tracer.TINY)
    assert traced["part_to_part_calls"] > 50  # the tracer saw the run's parts call each other
    assert traced["up_a_layer"] == [] and traced["across_a_layer"] == []
    into_run = [row for row in traced["up_a_layer_through_a_library"] if row["to"].startswith("trainer.run.")]
    assert into_run == []


def test_no_private_name_is_imported_from_another_module():
    """A module's ``_name`` is its own: another module that needs it needs a public name."""
    crossing = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainer"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                crossing += [f"{path.relative_to(ROOT)}: from {node.module} import {name}" for name in private]
    assert crossing == []
