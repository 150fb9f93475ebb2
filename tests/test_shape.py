"""The code's shape, checked: the config a command composes does not drift, functions and modules stay
short enough to read (or say why not), and the compiler is called from one place only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

GOLDEN = Path(__file__).parent / "golden"
TRAINER = ROOT / "trainer"
MAX_LINES = 60
MAX_MODULE_LINES = 400  # a module past this has more than one job, or says in its docstring why not
WHY_LONGER = "why longer:"
COMPILE_SITE = ("switches/model_transforms.py", "apply_compile")

CASES = {
    "base": [],
    "base_scale_smoke": ["scale=smoke"],
    "base_recipe_resnet50": ["+recipe=resnet50"],
    "base_recipe_resnet50_scale_smoke": ["+recipe=resnet50", "scale=smoke"],
    "base_recipe_vit": ["+recipe=vit"],
    "base_recipe_vit_scale_smoke": ["+recipe=vit", "scale=smoke"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_composed_job_config_is_unchanged(name):
    """What ``python train.py ARGS --cfg job`` prints, composed in-process the way Hydra does."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict

    from trainer.config.compose import prepare_hydra

    prepare_hydra()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=CASES[name], return_hydra_config=False)
    with open_dict(cfg):
        cfg.pop("hydra", None)
    assert OmegaConf.to_yaml(cfg) == (GOLDEN / f"cfg_job_{name}.yaml").read_text()


def test_train_py_cfg_job_prints_the_golden_config():
    """The user's path: train.py itself, for one case (the in-process test covers the rest)."""
    out = subprocess.run(
        [sys.executable, "train.py", "+recipe=vit", "scale=smoke", "--cfg", "job"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == (GOLDEN / "cfg_job_base_recipe_vit_scale_smoke.yaml").read_text()


def test_help_lists_every_flag_from_its_schema_field(monkeypatch):
    """``train.py --help`` reads each flag's default, choices and help from the one definition."""
    from trainer import config
    from trainer.config.compose import flags_help

    text = flags_help()
    for key in (*config.FLAG_KEYS, "repeats", "repeat_seeds", "report.val_per_epoch"):
        assert f"  {key}=" in text, key
    assert "amp_dtype=auto [auto | bf16 | fp16]  amp's dtype" in text
    field_ = config.SCHEMA_FIELDS["channels_last"]
    monkeypatch.setattr(field_, "metadata", {**field_.metadata, "help": "said once"})
    assert "  channels_last=false  said once" in flags_help()


def test_the_flags_keep_the_order_the_report_shows_them_in():
    """metrics.json's flags and the A/B report's columns: the switches, then optim, data and runtime keys,
    then the recipe's ingredients."""
    from trainer import config

    assert config.FLAG_KEYS == (
        "amp", "amp_dtype", "compile", "compile_mode", "compile_backend", "compile_cache", "channels_last", "progressive_resize", "ema", "accumulate",
        "strategy", "devices",
        "num_nodes", "profile", "tf32", "cudnn_benchmark", "activation_checkpointing", "sync_batchnorm",
        "lr_scaling", "cuda_alloc_conf", "optim.fused", "optim.zero_grad_to_none", "data.batch_size",
        "data.num_workers", "data.auto_workers", "data.gpu_normalize", "data.device_prefetch",
        "data.device_resident", "data.decoder", "data.nvjpeg_library", "data.loader", "data.decode_scale",
        "data.cache_in_memory", "data.cache", "runtime.allocator",
        # the recipes' ingredients (they change what is learned), after the switches and settings
        "drop_path_rate", "zero_init_residual", "eval_hflip", "optim.name", "optim.norm_weight_decay",
        "optim.bias_weight_decay", "loss.name", "loss.label_smoothing", "loss.bce_target_threshold", "data.augment",
        "data.crop_min_scale", "data.augment_policy", "data.randaugment_magnitude", "data.randaugment_ops",
        "data.random_erasing", "data.mixup_alpha", "data.cutmix_alpha", "data.repeated_augment", "data.eval_image_size",
        "data.eval_resize_ratio",
    )  # fmt: skip
    kinds = (config.OPTIMIZATION_FLAGS, config.RUN_SETTINGS, config.RECIPE_FLAGS)
    assert set().union(*kinds) == set(config.FLAG_KEYS) and sum(map(len, kinds)) == len(config.FLAG_KEYS)


def _functions(tree: ast.AST):
    """Every function and method with its qualified name (Class.method, outer.inner)."""

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def long_functions_without_a_reason(root: Path = TRAINER) -> list:
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for name, node in _functions(ast.parse(text)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES and not any(WHY_LONGER in line for line in lines[node.lineno - 1 : node.end_lineno]):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {name} ({length} lines)")
    return found


def long_modules_without_a_reason(root: Path = TRAINER) -> list:
    """Modules over MAX_MODULE_LINES lines whose docstring has no ``why longer:`` line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        length = len(text.splitlines())
        if length > MAX_MODULE_LINES and WHY_LONGER not in (ast.get_docstring(ast.parse(text)) or ""):
            found.append(f"{path.relative_to(root.parent)} ({length} lines)")
    return found


def _aliases(tree: ast.AST) -> tuple:
    """Names a module binds to ``torch.compile`` and to ``torch._dynamo`` by importing them."""
    compile_names, dynamo_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "torch":
            for alias in node.names:
                if alias.name == "compile":
                    compile_names.add(alias.asname or alias.name)
                if alias.name == "_dynamo":
                    dynamo_names.add(alias.asname or alias.name)
        if isinstance(node, ast.Import):
            dynamo_names |= {a.asname for a in node.names if a.name == "torch._dynamo" and a.asname}
    return compile_names, dynamo_names


def _compiles(node: ast.AST, compile_names: set, dynamo_names: set) -> bool:
    """A place that compiles, or takes hold of the compiler so that it can be called elsewhere:

    - ``x.compile(...)`` called (not ``re.compile``), and ``torch.compile`` referred to at all
      (``fn = torch.compile; fn(net)``, a decorator), or ``@x.compile`` as a decorator;
    - ``torch.compile`` imported under any name (``from torch import compile as c``), and that name used;
    - ``torch._dynamo.optimize`` referred to, also through an alias of ``torch._dynamo``
      (``import torch._dynamo as d``, ``from torch import _dynamo``) or imported itself;
    - ``getattr(x, "compile")`` or ``getattr(x, "optimize")`` with the name written out.

    Where it stops: a name built at run time (``getattr(torch, "com" + "pile")``), ``exec``/``eval``,
    ``importlib``, or a module object passed around; those hide from any reading of the source and
    would be deliberate, which review catches.
    """
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "compile":
            return not (isinstance(func.value, ast.Name) and func.value.id == "re")
        if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
            name = node.args[1]
            return isinstance(name, ast.Constant) and name.value in ("compile", "optimize")
        return False
    if isinstance(node, ast.Attribute):
        if node.attr == "compile" and isinstance(node.value, ast.Name) and node.value.id == "torch":
            return True
        if node.attr == "optimize":
            value = node.value
            return "_dynamo" in ast.unparse(value) or (isinstance(value, ast.Name) and value.id in dynamo_names)
        return False
    if isinstance(node, ast.Name):
        return node.id in compile_names and isinstance(node.ctx, ast.Load)
    if isinstance(node, ast.ImportFrom):
        return node.module == "torch._dynamo" and any(a.name == "optimize" for a in node.names)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return any(isinstance(d, ast.Attribute) and d.attr == "compile" for d in node.decorator_list)
    return False


def compile_calls_outside_the_one_place(root: Path = TRAINER) -> list:
    """Every place in ``root`` that compiles, outside ``model_transforms.apply_compile`` (``_compiles``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = set()
        for name, node in _functions(tree):
            if (str(path.relative_to(root)), name) == COMPILE_SITE:
                allowed |= {id(n) for n in ast.walk(node)}
        compile_names, dynamo_names = _aliases(tree)
        for node in ast.walk(tree):
            if _compiles(node, compile_names, dynamo_names) and id(node) not in allowed:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return sorted(set(found), key=lambda site: (site.split(":")[0], int(site.split(":")[1])))


def test_no_function_in_trainer_is_over_60_lines_without_saying_why():
    assert long_functions_without_a_reason() == []


def test_no_module_in_trainer_is_over_400_lines_without_saying_why():
    assert long_modules_without_a_reason() == []


def test_the_module_check_finds_a_long_module(tmp_path):
    pkg = tmp_path / "trainer"
    (pkg / "sub").mkdir(parents=True)
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES))
    (pkg / "sub" / "long.py").write_text(f'"""Does two things."""\n{body}\n')
    (pkg / "said.py").write_text(f'"""One table.\n\nwhy longer: the table is one piece.\n"""\n{body}\n')
    (pkg / "short.py").write_text(f"{body}\n")  # exactly the limit
    assert long_modules_without_a_reason(pkg) == [f"trainer/sub/long.py ({MAX_MODULE_LINES + 1} lines)"]


def test_the_compiler_is_called_only_in_apply_compile():
    assert compile_calls_outside_the_one_place() == []


def test_the_shape_checks_find_what_they_look_for(tmp_path):
    """The two checks above are able to fail: a planted long function and a planted compile call."""
    pkg = tmp_path / "trainer"
    pkg.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "long.py").write_text(f"def too_long():\n{body}\n\n\ndef fine():\n    return 1\n")
    (pkg / "justified.py").write_text(f"def long_but_said():\n    # why longer: a table\n{body}\n")
    (pkg / "compiles.py").write_text(
        "import re\nimport torch\n\n\ndef f(net):\n    re.compile('x')\n    net.compile()\n    return torch.compile(net)\n"
    )
    (pkg / "other.py").write_text(
        "import torch\nfrom torch import compile as c\n\n\n@torch.compile\ndef g(x):\n    return c(x)\n\n\n"
        "def h(m):\n    return torch._dynamo.optimize('inductor')(m)\n"
    )
    (pkg / "aliases.py").write_text(
        "import torch\nimport torch._dynamo as dyn\nfrom torch import _dynamo\n\n\n"
        "def a(net):\n    fn = torch.compile\n    return fn(net)\n\n\n"
        "def b(net):\n    return getattr(torch, 'compile')(net)\n\n\n"
        "def c(net):\n    return dyn.optimize('inductor')(net)\n\n\n"
        "def d(net):\n    opt = _dynamo.optimize\n    return opt('inductor')(net)\n\n\n"
        "def e(cfg):\n    return cfg.compile and torch.compiler.reset()\n"
    )
    (pkg / "switches").mkdir()
    (pkg / "switches" / "model_transforms.py").write_text("def apply_compile(net):\n    net.compile()\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "model_transforms.py").write_text("def apply_compile(net):\n    net.compile()\n")
    assert long_functions_without_a_reason(pkg) == [f"trainer/long.py:1 too_long ({MAX_LINES + 1} lines)"]
    assert compile_calls_outside_the_one_place(pkg) == [
        "trainer/aliases.py:7",  # fn = torch.compile
        "trainer/aliases.py:12",  # getattr(torch, 'compile')
        "trainer/aliases.py:16",  # dyn.optimize (import torch._dynamo as dyn)
        "trainer/aliases.py:20",  # _dynamo.optimize (from torch import _dynamo); not e's cfg.compile
        "trainer/compiles.py:7",
        "trainer/compiles.py:8",
        "trainer/other.py:5",  # @torch.compile: torch.compile referred to ...
        "trainer/other.py:6",  # ... and the function it decorates
        "trainer/other.py:7",  # c(x), c imported as torch.compile
        "trainer/other.py:11",
        "trainer/sub/model_transforms.py:2",
    ]
