"""ImageClassifier: the LightningModule that trains any ``nn.Module`` mapping images to logits.

Recipe models (torchvision ResNet-50, ViT-B/16), timm models and a user's own ``nn.Module`` all
arrive here by ``model._target_``; a user's own LightningModule is trained as it is instead.
"""

from __future__ import annotations

import logging

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from pytorch_lightning.strategies import FSDPStrategy, ModelParallelStrategy
from torch.amp.grad_scaler import OptState
from torch.distributed.fsdp import fully_shard

from trainer.data.seeding import sample_seed
from trainer.models.blocks import repeated_blocks
from trainer.models.losses import TrainingLoss
from trainer.models.optimizers import build_optimizer, build_scheduler

log = logging.getLogger(__name__)


class ImageClassifier(pl.LightningModule):
    """``loss``: a TrainingLoss (None: cross-entropy with ``label_smoothing``); ``mixing``: mixup /
    cutmix of each training batch (data/mixing.py), seeded by (``seed``, epoch, batch index);
    ``eval_hflip``: validation averages the logits of each image and its mirror image."""

    # what it logs, the names checkpoint.monitor may choose from
    LOGGED_METRICS = ("val/acc", "val/loss", "train/loss_epoch")

    def __init__(
        self,
        net: torch.nn.Module,
        optim_cfg,
        sched_cfg,
        label_smoothing: float = 0.0,
        on_nan: str = "stop",
        *,
        loss=None,
        mixing=None,
        eval_hflip: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        self.net = net
        self.on_nan = on_nan
        self.optim_cfg = optim_cfg
        self.sched_cfg = sched_cfg
        self.label_smoothing = label_smoothing
        self.loss = loss if loss is not None else TrainingLoss(label_smoothing=label_smoothing)
        self.mixing = mixing
        self.eval_hflip = eval_hflip
        self.seed = seed
        self._zero_grad_to_none = bool(optim_cfg.get("zero_grad_to_none", True))
        self._step_skipped = False  # on_nan=skip: a micro-batch of this optimizer step was not finite

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.mixing is not None:
            # the batch's own stream (index -1 - batch_idx, apart from the samples' 0, 1, ...), each rank its own
            seed = sample_seed(self.seed + (self.global_rank << 32), self.current_epoch, -1 - batch_idx)
            x, y = self.mixing(x, y, seed)
        loss = self.loss(self(x), y)
        if self.on_nan == "skip" and not torch.isfinite(loss):
            self._step_skipped = True  # on_before_optimizer_step drops the whole optimizer step
            return None  # Lightning skips this micro-batch's backward
        # the epoch mean is reduced (across ranks too) once per epoch; the step values (train/loss)
        # are written by the StepLoss callback, which reads them without a device sync
        self.log("train/loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=y.shape[0])
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        if self.eval_hflip:  # test-time flip: the mirror image's logits averaged in
            logits = (logits + self(x.flip(-1))) / 2
        n = y.shape[0]
        self.log("val/loss", F.cross_entropy(logits, y), on_epoch=True, sync_dist=True, batch_size=n)
        self.log(
            "val/acc",
            (logits.argmax(1) == y).float().mean(),
            on_epoch=True,
            sync_dist=True,
            prog_bar=True,
            batch_size=n,
        )

    def configure_model(self):
        """strategy=fsdp2: shard each repeated block, then the root, with FSDP2's ``fully_shard``."""
        if not isinstance(self.trainer.strategy, ModelParallelStrategy) or getattr(self, "_sharded", False):
            return

        mesh = self.device_mesh["data_parallel"]
        blocks = repeated_blocks(self.net)
        for block in blocks:
            fully_shard(block, mesh=mesh)
        log.info(
            "fsdp2: %d blocks sharded (%s), then the whole model",
            len(blocks),
            ", ".join(sorted({type(b).__name__ for b in blocks})) or "none found",
        )
        fully_shard(self.net, mesh=mesh)
        self._sharded = True  # compile=true comes after this (model_transforms.CompileAfterSetup)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        # optim.zero_grad_to_none=true (default) frees gradient memory between steps instead of
        # writing zeros into it
        optimizer.zero_grad(set_to_none=self._zero_grad_to_none)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        """trainer.gradient_clip_val where Lightning's own clipping cannot act.

        - strategy=fsdp, by norm: Lightning's FSDP precision plugin refuses it at the first step
          (Lightning-AI/pytorch-lightning#19235): ``torch.nn.utils.clip_grad_norm_`` would see only
          this rank's shards, and the plugin has no reference to the root FSDP module, whose
          ``clip_grad_norm_`` reduces the norm across ranks. This module does (``trainer.strategy.model``).
        - A fused optimizer (``optim.fused=auto`` picks one on CUDA) under amp: Lightning's AMP plugin
          refuses to clip the gradients of any optimizer that can unscale them in its own step, bf16
          too, where no scaler exists and the gradients are true ones (a ViT with amp on a GPU failed
          at its first step). Under fp16 Lightning leaves them scaled, and under FSDP it would clip
          them scaled, 65536 times too hard: they are unscaled here first (``_unscale_once``), and
          then clipped here.

        Everything else takes Lightning's own path.
        """
        if not gradient_clip_val:
            return
        self._unscale_once(optimizer)
        if gradient_clip_algorithm == "norm" and isinstance(self.trainer.strategy, FSDPStrategy):
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
            return
        unscales_itself = getattr(optimizer, "_step_supports_amp_scaling", False)  # torch's fused kernels
        if unscales_itself and not isinstance(self.trainer.strategy, FSDPStrategy):
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if gradient_clip_algorithm == "value":
                torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
            else:
                torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_before_optimizer_step(self, optimizer):
        """on_nan=skip: a step with a non-finite micro-batch changes no weight. Returning None skips only
        that micro-batch's backward; the optimizer still stepped (fp32 and bf16) with what was there: with
        accumulate, the window's other micro-batches' gradients, and with optim.zero_grad_to_none=false,
        zeros, which SGD's momentum and weight decay still move. Without gradients (None) every optimizer
        leaves every weight as it is, as fp16's loss scaler skips the step. (The step still counts:
        global_step, the schedule, EMA.)

        fp16 under strategy=fsdp with a fused optimizer: unscale here, so that the ranks agree on an
        overflow. Lightning's FSDP precision unscales only optimizers that do not unscale themselves; a
        fused one then looks for inf in this rank's shards alone (the sharded scaler all-reduces what it
        found in ``unscale_``), so ranks could disagree about skipping a step and their scales drift."""
        if self._step_skipped:
            optimizer.zero_grad(set_to_none=True)
            self._step_skipped = False
            return
        if isinstance(self.trainer.strategy, FSDPStrategy):
            self._unscale_once(optimizer)

    def _unscale_once(self, optimizer) -> bool:
        """Under an fp16 loss scaler, a fused optimizer's gradients unscaled (once a step; no host sync).
        True where there is such a scaler and optimizer: the gradients are unscaled now."""
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is None or not getattr(optimizer, "_step_supports_amp_scaling", False):
            return False
        state = scaler._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(optimizer)  # the scaler's step then passes no scale to the fused kernel
            # strategy=fsdp's ShardedGradScaler makes its found-inf flags of shape (1,) (GradScaler's are
            # 0-d); the scaler's step hands their sum to the fused Adam/AdamW, which subtracts it in place
            # from its 0-d step counters and fails at the first step ("output with shape [] doesn't match
            # the broadcast shape [1]", pytorch/pytorch#140514). A 0-d view is the same flag: no copy, no
            # host sync, and the scaler's update reads it as before.
            state["found_inf_per_device"] = {d: f.reshape(()) for d, f in state["found_inf_per_device"].items()}
        return True

    def configure_optimizers(self):
        loss_scaled_on_cuda = str(self.trainer.precision) == "16-mixed" and self.device.type == "cuda"
        optimizer = build_optimizer(self.net, self.optim_cfg, loss_scaled_on_cuda, on_cuda=self.device.type == "cuda")
        if self.sched_cfg.name == "constant":  # also the only schedule for max_epochs=-1 (no known length)
            return optimizer
        sched = build_scheduler(
            optimizer, self.sched_cfg, int(self.trainer.estimated_stepping_batches), self.trainer.max_epochs
        )
        return optimizer if sched is None else {"optimizer": optimizer, "lr_scheduler": sched}
