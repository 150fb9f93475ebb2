"""Build the LightningModule from ``cfg.model``: anything Hydra can instantiate by ``_target_``.

- an ``nn.Module`` (torchvision, timm via ``timm.create_model``, your own class) is wrapped in
  ``ImageClassifier`` with the recipe's optimizer, schedule and loss;
- a ``LightningModule`` is trained as it is (it brings its own steps and optimizers).
"""

from __future__ import annotations

import importlib.util
import inspect
import logging

import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from lightning_utilities.core.overrides import is_overridden
from omegaconf import OmegaConf
from torchvision.models.vision_transformer import VisionTransformer

from trainer.data.mixing import batch_mixing
from trainer.errors import ConfigError, cause_text
from trainer.models.classifier import ImageClassifier
from trainer.models.losses import TrainingLoss
from trainer.models.regularize import apply_drop_path, zero_init_residual

log = logging.getLogger(__name__)


def build_module(cfg) -> pl.LightningModule:
    target = cfg.model.get("_target_")
    model_cfg = cfg.model
    if "num_classes" in model_cfg and not _takes(target, "num_classes"):
        model_cfg = {
            k: v for k, v in model_cfg.items() if k != "num_classes"
        }  # a class of its own without that argument
    try:
        obj = instantiate(model_cfg, _convert_="all")
    except InstantiationException as e:
        cause = cause_text(e)
        hint = (
            " (timm models need: pip install timm)"
            if str(target).startswith("timm") and not _importable("timm")
            else ""
        )
        raise ConfigError(
            f"Could not build the model from 'model._target_={target}'{hint}: {cause}. "
            "model._target_ must name an importable nn.Module or LightningModule class (or a function returning one); "
            "the other model.* keys are passed to it as arguments."
        ) from None
    if isinstance(obj, torch.nn.Module):
        _apply_recipe_ingredients(obj, cfg, f"'model._target_={target}'")
    if isinstance(obj, pl.LightningModule):
        _refuse_classifier_ingredients(cfg, target)
        return obj
    if isinstance(obj, torch.nn.Module):
        return ImageClassifier(
            obj,
            cfg.optim,
            cfg.sched,
            cfg.loss.label_smoothing,
            on_nan=cfg.on_nan,
            loss=TrainingLoss.of(cfg.loss),
            mixing=batch_mixing(cfg.data, int(cfg.data.num_classes)),
            eval_hflip=bool(cfg.get("eval_hflip", False)),
            seed=int(cfg.seed),
        )
    raise ConfigError(f"'model._target_={target}' built a {type(obj).__name__}, not an nn.Module or LightningModule.")


def _apply_recipe_ingredients(net: torch.nn.Module, cfg, what: str) -> None:
    """drop_path_rate and zero_init_residual on the freshly built network (regularize.py)."""
    eval_size = cfg.data.get("eval_image_size")
    if eval_size and eval_size != cfg.data.image_size and _fixed_input_size(net):
        raise ConfigError(
            f"data.eval_image_size={eval_size}: {what} takes only {cfg.data.image_size} px images (a ViT's position "
            "embedding has one size), so it cannot validate at another. Set data.eval_image_size=null, or use a "
            "model whose input size may vary (a ResNet, a timm model with dynamic_img_size=True)."
        )
    if cfg.get("zero_init_residual"):
        n = zero_init_residual(net, what)
        log.info("zero_init_residual: the last normalization of %d residual blocks starts at 0", n)
    if cfg.get("drop_path_rate", 0.0) > 0:
        n = apply_drop_path(net, float(cfg.drop_path_rate), what)
        log.info("drop_path_rate=%s: stochastic depth on %d residual blocks (linear in depth)", cfg.drop_path_rate, n)


def _fixed_input_size(net: torch.nn.Module) -> bool:
    """torchvision's ViT checks that every image has its one size (timm's ViT unless dynamic_img_size)."""
    if any(isinstance(m, VisionTransformer) for m in net.modules()):
        return True
    return any(getattr(m, "strict_img_size", False) for m in net.modules())


# the keys the built-in classifier acts on in its own steps: a user's LightningModule brings its own
CLASSIFIER_KEYS = {
    "data.mixup_alpha": 0.0,
    "data.cutmix_alpha": 0.0,
    "loss.name": "cross_entropy",
    "loss.bce_target_threshold": None,
    "eval_hflip": False,
}


def _refuse_classifier_ingredients(cfg, target) -> None:
    given = [f"{k}={OmegaConf.select(cfg, k)}" for k, off in CLASSIFIER_KEYS.items() if OmegaConf.select(cfg, k) != off]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: these act in the built-in classifier's training and validation steps, and "
            f"'model._target_={target}' is a LightningModule with steps of its own. Leave them at their defaults "
            "and mix, flip or choose the loss in your module, or give model._target_ an nn.Module (images -> logits)."
        )


def _peek(path: str):
    """``hydra.utils.get_object`` without the ERROR line it logs for a bad path: these lookups only
    peek, and ``build_module`` reports a bad ``model._target_`` in one paragraph of its own."""
    hydra_log = logging.getLogger("hydra.utils")
    was = hydra_log.disabled
    hydra_log.disabled = True
    try:
        return get_object(path)
    finally:
        hydra_log.disabled = was


def _takes(target, argument: str) -> bool:
    """Whether the class or function named by ``target`` accepts ``argument`` (or any keyword)."""
    try:
        fn = _peek(str(target))
        params = inspect.signature(fn).parameters.values()
    except Exception:
        return True  # cannot tell: pass it, and let instantiation say what is wrong
    return any(p.name == argument or p.kind == p.VAR_KEYWORD for p in params)


def _importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# settings that only the built-in classifier's own training step and optimizer read
_CLASSIFIER_PREFIXES = ("optim.", "sched.", "loss.")


def user_lightning_module_class(cfg):
    """The class ``model._target_`` names, if it is a LightningModule of the user's own (else None)."""
    try:
        target = _peek(str(cfg.model.get("_target_")))
    except Exception:
        return None  # build_module says what is wrong with it
    if inspect.isclass(target) and issubclass(target, pl.LightningModule) and not issubclass(target, ImageClassifier):
        return target
    return None


def check_user_module(module_or_class, cfg, overrides) -> None:
    """A user's own LightningModule brings its own step and optimizer: refuse the switches that would not reach it.

    Called with the class before any data is read (``run``), and with the built module for a
    factory function that returns one. Only what the command line asks for is refused; a recipe's
    optimizer settings (lr_scaling, optim.*, sched.*) are noted as not applying.
    """
    cls = module_or_class if isinstance(module_or_class, type) else type(module_or_class)
    if not issubclass(cls, pl.LightningModule) or issubclass(cls, ImageClassifier):
        return
    name = cls.__name__
    given = {ov.lstrip("+~").split("=", 1)[0] for ov in overrides or []}
    problems = []
    if "lr_scaling" in given and cfg.lr_scaling != "none":
        problems.append(
            f"lr_scaling={cfg.lr_scaling} scales the trainer's own optimizer, but {name}.configure_optimizers builds yours: drop it"
        )
    if cfg.on_nan == "skip":
        problems.append(
            f"on_nan=skip skips steps inside the trainer's own training_step, not {name}'s: use on_nan=stop or off"
        )
    own = sorted(k for k in given if k.startswith(_CLASSIFIER_PREFIXES))
    if own:
        problems.append(
            f"{', '.join(own)} configure the trainer's own optimizer, schedule and loss; {name} has its own (configure_optimizers, training_step): drop them"
        )
    unsharded = _unsharded_problem(cls, cfg)
    if unsharded:
        problems.append(unsharded)
    if problems:
        raise _user_module_error(name, problems)
    if cfg.get("recipe"):
        log.warning(
            "%s is your own LightningModule: the recipe's optimizer, schedule, loss and lr_scaling do not apply to it "
            "(its configure_optimizers and training_step decide); the recipe's data, model-independent flags and trainer settings do.",
            name,
        )


def _user_module_error(name: str, problems) -> ConfigError:
    return ConfigError(
        f"model._target_ is a LightningModule of your own ({name}), which the trainer runs as it is. "
        + "; ".join(problems)
        + "."
    )


def _unsharded_problem(cls, cfg):
    """strategy=fsdp2 with a user's LightningModule that has no ``configure_model``: what to do, or None.

    Lightning's ModelParallelStrategy shards a model only in its ``configure_model`` hook and stops
    with a TypeError (a traceback from every rank) where the hook is not overridden; it checks as
    Lightning does. The trainer shards a plain nn.Module itself (``ImageClassifier.configure_model``:
    each repeated block, then the network), but not a module of the user's own: which of its
    submodules its steps call, and which parameters it reads outside them (sharded, they become
    DTensors), only its author knows.
    """
    if cfg.get("strategy") != "fsdp2" or is_overridden("configure_model", cls, pl.LightningModule):
        return None
    return (
        f"strategy=fsdp2 shards a model in its configure_model hook (Lightning's ModelParallelStrategy requires one), "
        f"and {cls.__name__} has none: give it a configure_model that shards its networks once, e.g. "
        "torch.distributed.fsdp.fully_shard(self.net, mesh=self.device_mesh['data_parallel']) (its repeated blocks first, "
        "then the whole network); or name a plain nn.Module as model._target_ (the trainer shards it itself), "
        "or use strategy=ddp (or strategy=fsdp on GPUs, which wraps the module itself)"
    )


def refuse_unsharded_user_module(cfg) -> None:
    """strategy=fsdp2: refuse a user's LightningModule class without ``configure_model`` from the config
    alone, before torchrun starts any rank (``switchboard.resolve`` runs in the launching process);
    a factory function's module is checked once built (``check_user_module``, in each rank)."""
    if cfg.get("strategy") != "fsdp2" or cfg.get("model") is None:
        return
    cls = user_lightning_module_class(cfg)
    problem = _unsharded_problem(cls, cfg) if cls is not None else None
    if problem:
        raise _user_module_error(cls.__name__, [problem])
