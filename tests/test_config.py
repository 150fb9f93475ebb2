"""Config composition, scale precedence and the bad-input messages (no training here)."""

from __future__ import annotations

import re

import pytest
from conftest import TINY, run_cli

from trainer.config import check_overrides
from trainer.errors import ConfigError

RECIPES = ["resnet50", "vit"]


def test_base_config_composes(compose):
    cfg = compose()
    assert cfg.model._target_ == "trainer.models.tiny.TinyCNN"
    assert cfg.data.name == "synthetic"
    assert cfg.amp is False and cfg.compile is False and cfg.accumulate == 1


@pytest.mark.parametrize(
    "recipe,target,optim",
    [
        ("resnet50", "torchvision.models.resnet50", "sgd"),
        ("vit", "torchvision.models.vision_transformer.VisionTransformer", "adamw"),
    ],
)
def test_recipes_resolve_as_all_off_baselines(compose, recipe, target, optim):
    cfg = compose(f"+recipe={recipe}")
    assert cfg.recipe == recipe and cfg.model._target_ == target and cfg.optim.name == optim
    assert cfg.data.image_size == 224
    assert cfg.loss.label_smoothing > 0 and cfg.sched.name == "cosine" and cfg.sched.warmup_epochs > 0
    assert not any([cfg.amp, cfg.compile, cfg.channels_last, cfg.tf32, cfg.cudnn_benchmark, cfg.profile])
    assert cfg.accumulate == 1 and cfg.strategy == "auto"
    if recipe == "vit":
        assert cfg.trainer.gradient_clip_val == 1.0


def test_scale_smoke_beats_recipe_and_cli_beats_scale(compose):
    cfg = compose("+recipe=vit", "scale=smoke")
    assert cfg.data.image_size == 32 and cfg.trainer.limit_train_batches == 8
    assert cfg.model.hidden_dim == 192 and cfg.model.patch_size == 4  # the recipe's own smoke block
    assert cfg.model.image_size == 32  # interpolation follows the scaled value
    cfg = compose("+recipe=vit", "scale=smoke", "data.image_size=48", "model.num_layers=2")
    assert cfg.data.image_size == 48 and cfg.model.image_size == 48 and cfg.model.num_layers == 2


def test_full_scale_keeps_the_recipe(compose):
    cfg = compose("+recipe=resnet50")
    assert cfg.data.batch_size == 256 and cfg.trainer.limit_train_batches == 1.0


@pytest.mark.parametrize(
    "override,expected",
    [
        ("ampp=true", ["'ampp'", "Did you mean 'amp'"]),
        ("accumulate=two", ["'accumulate'", "not an integer"]),
        ("accumulate=0", ["'accumulate'", ">= 1"]),
        ("amp=maybe", ["'amp'", "true, false"]),
        ("+recipe=resnet5", ["Unknown recipe 'resnet5'", "resnet50, vit"]),
        ("strategy=ddpp", ["'strategy'", "auto, ddp, fsdp, fsdp2"]),
        ("amp_dtype=fp8", ["'amp_dtype'", "auto, bf16, fp16"]),
        ("compile_mode=fast", ["'compile_mode'", "max-autotune"]),
        ("data.batchsize=8", ["'data.batchsize'", "Did you mean 'data.batch_size'"]),
        ("trainer.limit_train_batches=2.5", ["'trainer.limit_train_batches'", "fraction"]),
        ("accumulate=1,0", ["'accumulate'", ">= 1"]),  # each sweep value is checked
    ],
)
def test_bad_overrides_name_the_key_and_allowed_values(override, expected):
    with pytest.raises(ConfigError) as e:
        check_overrides([override], RECIPES)
    for text in expected:
        assert text in str(e.value)


def test_good_overrides_pass():
    check_overrides(
        [
            "amp=false,true",
            "+recipe=vit",
            "scale=smoke",
            "data=builtin",
            "model.width=4",
            "hydra.run.dir=x",
            "trainer.limit_train_batches=3",
        ],
        RECIPES,
    )


@pytest.mark.parametrize(
    "args,expected",
    [
        (["ampp=true"], "Did you mean 'amp'"),
        (["accumulate=two"], "'accumulate'"),
        (["+recipe=nope"], "Unknown recipe 'nope'"),
        (["model=resnt50"], "Unknown model 'resnt50' (model=resnt50). Available: resnet18, resnet50, tiny, vit."),
        (["strategy=fsdp"], "strategy=fsdp2"),
        (["amp=true", "amp_dtype=fp16"], "amp_dtype=fp16"),
        (["data=imagefolder", "data.root=/does/not/exist"], "data.root"),
        (["model._target_=no_such_pkg.Net"], "model._target_"),
        (["-m", "amp=false,true", "--cfg", "job"], "--cfg and --multirun cannot be combined"),
    ],
)
def test_bad_input_reaches_the_user_without_a_traceback(tmp_path, args, expected):
    r = run_cli(f"hydra.run.dir={tmp_path}/run", *args)
    assert r.returncode == 2, r.stderr[-2000:]
    assert expected in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert "HYDRA_FULL_ERROR" not in r.stderr


@pytest.mark.parametrize(
    "override",
    [
        "trainer.limit_train_batches=null",
        "trainer.limit_val_batches=null",
        "trainer.deterministic=warn",
        "trainer.num_sanity_val_steps=-1",
        "trainer.check_val_every_n_epoch=null",
        "trainer.log_every_n_steps=0",
        "trainer.gradient_clip_val=1",
        "trainer.max_epochs=0",
    ],
)
def test_every_value_lightning_accepts_is_accepted(train, override):
    m, _ = train(override)
    assert m["status"] == "ok", m["error"]


def test_a_seed_outside_numpys_range_and_other_values_out_of_range_are_refused_before_anything_runs(compose):
    """numpy's seeding raised its ValueError with a traceback at the job's start."""
    from trainer.config import validate
    from trainer.errors import ConfigError

    for bad in ("-1", str(2**32)):
        with pytest.raises(ConfigError, match=r"'seed'.*0\.\.4294967295"):
            validate(compose(f"seed={bad}"))
    validate(compose(f"seed={2**32 - 1}"))
    # and values that were taken without a word, though nothing could train on them
    for bad in (
        "optim.weight_decay=-1",
        "optim.momentum=1.5",
        "trainer.gradient_clip_val=-1",
        "sched.min_lr_ratio=5",
        "tune.acc_tolerance=5",
    ):
        with pytest.raises(ConfigError, match=re.escape(f"Bad value for '{bad.split('=')[0]}'")):
            validate(compose(bad))


def test_an_unknown_option_of_a_config_group_is_one_paragraph_listing_them():
    """Hydra answered data=foo with its own text (its search path, HYDRA_FULL_ERROR) and exit code 1;
    logger=null with a traceback. A command with configs of its own (-cd, hydra.searchpath) is Hydra's."""
    from trainer.command_line import checked_argv, group_options
    from trainer.config import check_overrides
    from trainer.errors import ConfigError

    for overrides, says in (
        (["data=foo"], "Unknown data 'foo' (data=foo). Available: builtin, cifar10"),
        (["logger=[csv,mlfow]"], "Did you mean 'logger=mlflow'?"),
        (["logger=null"], "logger=[] turns every tracker off"),
        (["scale=smoke,tiny"], "Unknown scale 'tiny'"),
    ):
        with pytest.raises(ConfigError, match=re.escape(says)):
            check_overrides(overrides, [], group_options)
    check_overrides(["data=imagefolder", "logger=[csv,mlflow]", "~logger", "+bench=amp"], [], group_options)
    checked_argv(["-cd", "/my/configs", "data=mine"])
    checked_argv(["--config-dir=/my/configs", "data=mine"])


def test_a_data_root_the_chosen_data_ignores_is_refused_unless_the_command_chose_that_data(compose, tmp_path):
    """data.root without data=imagefolder (or another format) trained on the synthetic set, saying nothing.
    A data= the command line chose itself (a sweep over data=imagefolder,synthetic) is said, not refused."""
    from trainer.config import validate
    from trainer.errors import ConfigError

    for data in ("synthetic", "builtin", "custom"):
        with pytest.raises(ConfigError, match=rf"'data.root=/imgs' .* data={data} ignores it"):
            validate(compose(f"data={data}", "data.root=/imgs"))
    validate(compose("data=imagefolder", "data.root=/imgs"))
    r = run_cli(f"hydra.run.dir={tmp_path}/forgot", "data.root=/imgs")
    assert r.returncode == 2 and "data=synthetic ignores it" in r.stderr, r.stderr[-2000:]
    r = run_cli("-m", f"hydra.sweep.dir={tmp_path}/chose", *TINY, "data=synthetic", "data.root=/imgs")
    assert r.returncode == 0 and "warning: 'data.root=/imgs'" in r.stderr + r.stdout, r.stderr[-2000:]


def test_checkpoint_monitor_names_a_metric_the_model_logs(train):
    """val_acc (metrics.json's name) or a typo failed after the first epoch, in Lightning's traceback;
    val/acc keeps the best checkpoint beside last.ckpt."""
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"'checkpoint.monitor=val_acc': the model logs val/acc, val/loss"):
        train("checkpoint.enabled=true", "checkpoint.monitor=val_acc")
    m, out = train("checkpoint.enabled=true", "checkpoint.monitor=val/acc")
    assert m["status"] == "ok" and list((out / "checkpoints").glob("best-*.ckpt")), m.get("error")


def test_train_until_stopped_needs_a_constant_schedule(compose):
    from trainer.config import check_overrides, validate
    from trainer.errors import ConfigError

    check_overrides(["trainer.max_epochs=-1", "trainer.max_epochs=null"], [])
    with pytest.raises(ConfigError, match="sched.name=constant"):
        validate(compose("trainer.max_epochs=-1"))
    validate(compose("trainer.max_epochs=-1", "sched.name=constant"))


def test_train_until_stopped_runs_until_stopped(train):
    import pytorch_lightning as pl

    class StopAfterTwo(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = trainer.current_epoch >= 1

    original = pl.Trainer.__init__

    def init(self, *a, callbacks=None, **kw):
        original(self, *a, callbacks=list(callbacks or []) + [StopAfterTwo()], **kw)

    pl.Trainer.__init__ = init
    try:
        m, _ = train("trainer.max_epochs=-1", "sched.name=constant")
    finally:
        pl.Trainer.__init__ = original
    assert m["status"] == "ok" and [e["epoch"] for e in m["epochs"]] == [0, 1]


def test_defaults_are_defined_once_in_the_schema(compose):
    """configs/train.yaml picks groups and sets Hydra up; every value's default is the schema's, so
    what runs and what the report calls "off" (the schema default) cannot disagree."""
    import yaml
    from omegaconf import OmegaConf

    from trainer.config import TrainSchema
    from trainer.paths import CONFIG_DIR

    assert set(yaml.safe_load((CONFIG_DIR / "train.yaml").read_text())) == {"defaults", "hydra"}
    # the base run's optimizer, as it was when train.yaml still held values of its own
    assert (compose().optim.lr, compose().optim.ref_batch_size) == (0.05, 32)
    schema = OmegaConf.to_container(OmegaConf.structured(TrainSchema))
    composed = OmegaConf.to_container(compose(), resolve=True)
    for section in ("optim", "sched", "trainer", "loss", "checkpoint"):
        assert composed[section] == schema[section], section
    assert {k: v for k, v in composed.items() if not isinstance(v, dict)} == {
        k: v for k, v in schema.items() if not isinstance(v, dict)
    }


def test_the_package_has_no_import_cycles():
    """Modules import each other one way only (cli -> run -> launch, never back), checked on the
    source: every ``from .x import`` / ``from . import x``, at module level or inside functions."""
    import ast

    from trainer.paths import ROOT

    package = ROOT / "trainer"
    graph = {}
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        base = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                target = f"{anchor}.{node.module}" if node.module else anchor
                deps |= {f"{target}.{a.name}" for a in node.names} | {target}
        graph[module] = deps
    # a package's __init__ only re-exports its modules: an import from the package is an import
    # from the module that defines the name
    packages = {".".join(p.relative_to(ROOT).parent.parts) for p in package.rglob("__init__.py")}
    exported = {}
    for pkg in packages:
        for node in ast.parse((ROOT / pkg.replace(".", "/") / "__init__.py").read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                exported.update({f"{pkg}.{a.asname or a.name}": f"{pkg}.{node.module}" for a in node.names})
    graph = {m: {exported.get(d, d) for d in deps} for m, deps in graph.items() if m not in packages}
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def cycle_from(start):
        stack = [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    return trail + [start]
                if nxt not in trail:
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in map(cycle_from, graph) if c]
    assert not cycles, cycles[0]


def test_the_config_of_a_run_cannot_be_written_after_composition(train, compose, add_callbacks, monkeypatch):
    """From composition on, a job's config is what is saved and recorded: written neither while the
    job is built (here, just before its Trainer is) nor during the fit (a callback); the values the run
    settles itself (batch size, scaled lr) are the one exception, made in one place."""
    import pytorch_lightning as pl
    from omegaconf.errors import ReadonlyConfigError

    from trainer.run import build as run_build

    tried = []

    def attempt(cfg, when):
        try:
            cfg.data.batch_size = 3
        except ReadonlyConfigError:
            tried.append(when)

    real_trainer = run_build._trainer

    def trainer_after_a_write(parts):
        attempt(parts.cfg, "built")
        return real_trainer(parts)

    class Writer(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            attempt(trainer.datamodule.cfg._get_root(), "fit")

    monkeypatch.setattr(run_build, "_trainer", trainer_after_a_write)
    add_callbacks(Writer())
    m, _ = train("lr_scaling=linear", "optim.ref_batch_size=4")
    assert m["status"] == "ok" and tried == ["built", "fit"] and m["batch_size"] == 8
    asked = compose("lr_scaling=linear", "optim.ref_batch_size=4").optim.lr
    assert m["lr"] == pytest.approx(2 * asked)  # settled (batch 8 against 4): the one write that is allowed
