"""Whether a checkpoint fits the run that resumes from it, checked before Lightning restores it.

Why: Lightning finds a misfit deep inside its restore, or at the first optimizer step, and says so
with a traceback: a checkpoint saved with ``checkpoint.save_weights_only=true`` (``KeyError: Trying
to restore optimizer state``), one of another model (``model.width``, ``data.num_classes``: "size
mismatch for net.fc.weight"), one saved with another optimizer (``KeyError: 'step'`` at the first
step of AdamW continuing SGD), or a file that is no Lightning checkpoint at all (``KeyError:
'pytorch-lightning_version'``). Here each is one paragraph naming the checkpoint and what does not
fit: what the file is (``check_checkpoint``) before the trackers and the data are opened, and
whether the model and optimizer fit (``check_fits``) once the model is built, before any batch size
is searched or anything trains. Both map the file rather than read it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from trainer.errors import ConfigError
from trainer.launch.checkpoint_files import safe_load
from trainer.models.classifier import ImageClassifier

# what an optimizer's settings say about it: torch's SGD keeps momentum, the Adam family (AdamW, LAMB) betas
_OPTIMIZER_SIGN = {"sgd": "momentum", "adamw": "betas", "lamb": "betas"}


def check_checkpoint(path: str) -> None:
    """What the checkpoint at ``path`` is, before anything is built: a Lightning checkpoint with the
    optimizer's and the loop's state (ConfigError otherwise)."""
    ckpt = safe_load(path, mmap=True)
    if not ckpt:
        return  # a sharded checkpoint folder: its strategy reads it shard by shard
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "pytorch-lightning_version" not in ckpt:
        held = ", ".join(sorted(map(str, ckpt))[:5]) if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(
            f"Checkpoint {path} is not a checkpoint of this trainer (Lightning's): it holds {held}. ckpt_path resumes "
            "a run from the checkpoints it saved (its checkpoints/ folder, or ckpt_path=last)."
        )
    if "optimizer_states" not in ckpt:
        raise ConfigError(
            f"Checkpoint {path} holds the weights only (saved with checkpoint.save_weights_only=true): resuming needs "
            "the optimizer's and the loop's state as well. Resume from a full checkpoint, or train anew."
        )


def check_fits(path: str, module: torch.nn.Module, cfg: Any) -> None:
    """Whether the checkpoint at ``path`` (``check_checkpoint`` passed) fits this run's ``module``: the
    weights' names and shapes, and the optimizer's kind (ConfigError otherwise)."""
    ckpt = safe_load(path, mmap=True)
    if not ckpt:
        return
    if cfg.strategy not in ("fsdp", "fsdp2"):  # a sharded model's names and shapes are its strategy's to map
        _check_weights(path, ckpt["state_dict"], module)
    if isinstance(module, ImageClassifier):
        _check_optimizer(path, ckpt["optimizer_states"], cfg.optim.name)


def _check_weights(path: str, saved: Dict[str, Any], module: torch.nn.Module) -> None:
    own = module.state_dict()
    if not own:
        return  # a module that makes its layers later (configure_model)
    misfits: List[str] = [
        f"{name}: {tuple(saved[name].shape)} in the checkpoint, {tuple(tensor.shape)} here"
        for name, tensor in own.items()
        if name in saved and hasattr(saved[name], "shape") and tuple(saved[name].shape) != tuple(tensor.shape)
    ]
    if getattr(module, "strict_loading", True):
        missing = [name for name in own if name not in saved]
        extra = [name for name in saved if name not in own]
        if missing:
            misfits.append(f"missing from the checkpoint: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
        if extra:
            misfits.append(f"not in this model: {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
    if misfits:
        raise ConfigError(
            f"Checkpoint {path} holds another model than this run builds ({'; '.join(misfits[:3])}). Resume with the "
            "model settings it was trained with (model.*, data.num_classes, data.image_size for a ViT), or train anew."
        )


def _check_optimizer(path: str, states: List[Dict[str, Any]], name: str) -> None:
    groups = states[0].get("param_groups") if states else None
    if not groups or name not in _OPTIMIZER_SIGN:
        return
    saved_with = next((n for n, sign in _OPTIMIZER_SIGN.items() if sign in groups[0]), None)
    if saved_with is not None and _OPTIMIZER_SIGN[saved_with] != _OPTIMIZER_SIGN[name]:
        was = "sgd" if saved_with == "sgd" else "adamw or lamb"
        raise ConfigError(
            f"Checkpoint {path} was saved by another optimizer (its state is optim.name={was}'s), which optim.name={name} "
            f"cannot continue. Resume with optim.name={was.split()[0]}, or train anew."
        )


def lr_it_resumes_at(path: str) -> Optional[float]:
    """The learning rate a resume from ``path`` trains at: Lightning restores the optimizer's and its
    schedule's state, base lr included, so the lr this run's config gives is not applied. None where
    the checkpoint holds no optimizer (a user's module's, weights only)."""
    ckpt = safe_load(path, mmap=True)
    schedulers = ckpt.get("lr_schedulers") or []
    if schedulers and schedulers[0].get("base_lrs"):
        return float(schedulers[0]["base_lrs"][0])
    groups = ((ckpt.get("optimizer_states") or [{}])[0] or {}).get("param_groups") or []
    if groups:
        return float(groups[0].get("initial_lr", groups[0].get("lr")))
    return None
