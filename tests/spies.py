"""Models for tests that record what they saw inside forward: the only honest proof that a switch
changed what ran (autocast dtype, memory format, numerics settings, distributed state)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn

SEEN: list = []


def training_snapshots() -> list:
    """Snapshots taken in training forwards (validation runs without grad)."""
    return [s for s in SEEN if s["grad_enabled"]]


def _snapshot(x: torch.Tensor, conv: nn.Conv2d, out: torch.Tensor) -> dict:
    return {
        "input_dtype": x.dtype,
        "device": x.device.type,
        "conv_out_dtype": out.dtype,
        "autocast": torch.is_autocast_enabled(x.device.type),
        "input_channels_last": x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
        "weight_channels_last": conv.weight.is_contiguous(memory_format=torch.channels_last)
        and not conv.weight.is_contiguous(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "distributed": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "grad_enabled": torch.is_grad_enabled(),
    }


class ProbeNet(nn.Module):
    """A small CNN that appends a snapshot of its runtime context to SEEN on every forward."""

    def __init__(
        self,
        num_classes: int = 10,
        width: int = 8,
        fail_when: str | None = None,
        fail_in_forward: bool = False,
        nan_after: int | None = None,
        bad_input_in_forward: bool = False,
    ):
        super().__init__()
        self.fail_in_forward = fail_in_forward
        self.bad_input_in_forward = bad_input_in_forward  # what bad input found mid-epoch raises
        self.nan_after = nan_after  # training forwards after this many return NaN
        self.train_calls = 0
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, num_classes)
        if fail_when:
            raise RuntimeError(f"ProbeNet asked to fail: {fail_when}")

    def forward(self, x):
        if self.fail_in_forward:
            raise RuntimeError("ProbeNet forward failed on purpose")
        if self.bad_input_in_forward and self.training:
            from trainer.errors import ConfigError

            raise ConfigError("ProbeNet found bad input on purpose")
        out = self.conv(x)
        if not torch.compiler.is_compiling():
            # fully_shard (FSDP2) swaps the module's class for an "FSDP<Name>" subclass
            SEEN.append(dict(_snapshot(x, self.conv, out), module_class=type(self).__name__))
        logits = self.fc(torch.relu(self.bn(out)).mean((2, 3)))
        if self.training and self.nan_after is not None:
            self.train_calls += 1
            if self.train_calls > self.nan_after:
                logits = logits * float("nan")
        return logits


class ProbeLightningModule(pl.LightningModule):
    """A user's own LightningModule: trained as-is, with its own step and optimizer."""

    calls: list = []

    def __init__(self, num_classes: int = 10, lr: float = 0.01):
        super().__init__()
        self.net = ProbeNet(num_classes)
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        ProbeLightningModule.calls.append(batch_idx)
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class ShardedProbeLightningModule(ProbeLightningModule):
    """A user's own LightningModule for strategy=fsdp2: it shards its own network in configure_model,
    as Lightning's ModelParallelStrategy requires."""

    states: list = []  # (hook, class of the network, whether it is compiled)

    def _state(self, hook: str) -> None:
        ShardedProbeLightningModule.states.append(
            (hook, type(self.net).__name__, getattr(self.net, "_compiled_call_impl", None) is not None)
        )

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard

        if not getattr(self, "_sharded", False):
            self._state("configure_model")
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])
            self._sharded = True

    def on_train_start(self):
        self._state("on_train_start")


class SlowDataset(torch.utils.data.Dataset):
    """A planted input bottleneck: every sample sleeps (like slow storage or heavy decode)."""

    def __init__(self, n: int = 64, image_size: int = 16, num_classes: int = 10, sleep_ms: float = 5.0):
        self.n, self.size, self.classes, self.sleep = n, image_size, num_classes, sleep_ms / 1000

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import time

        time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, self.size, self.size, generator=g), i % self.classes


class MixedSizes(SlowDataset):
    """A user's dataset that forgot to resize: every other image is 4 px larger."""

    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return (torch.nn.functional.pad(image, (2, 2, 2, 2)) if i % 2 else image), label


class FetchLog(SlowDataset):
    """Appends each index a loader worker asks for to ``path``, one line each: every sample the loader's
    workers built (not the training process's own reads, such as the example batch a run measures)."""

    def __init__(self, path: str, n: int = 64, image_size: int = 16, num_classes: int = 10):
        super().__init__(n, image_size, num_classes, sleep_ms=0.0)
        self.path = path

    def line(self, i) -> str:
        return f"{i}\n"

    def __getitem__(self, i):
        if torch.utils.data.get_worker_info() is not None:
            with open(self.path, "a") as f:
                f.write(self.line(i))
        return super().__getitem__(i)


class TimedFetchLog(FetchLog):
    """FetchLog's lines as ``time index``: when each sample was built."""

    def line(self, i) -> str:
        import time

        return f"{time.time()} {i}\n"


class BatchRecorder(pl.Callback):
    """``pick(batch)`` of every training batch by (epoch, batch index); stops the fit at ``stop_at``
    (a planted failure that leaves the last checkpoint behind)."""

    def __init__(self, pick, stop_at=None):
        self.pick, self.seen, self.stop_at = pick, {}, stop_at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        at = (trainer.current_epoch, batch_idx)
        if at == self.stop_at:
            raise RuntimeError("stopped mid-epoch on purpose")
        self.seen[at] = self.pick(batch)


class SlowInitDataset(SlowDataset):
    """A data set that takes ``init_s`` to open (a slow listing, a cache being filled): a run still setting up."""

    def __init__(self, n: int = 64, image_size: int = 16, num_classes: int = 10, init_s: float = 60.0):
        import time

        time.sleep(init_s)
        super().__init__(n, image_size, num_classes, sleep_ms=0.0)


class ParentRecorder(SlowDataset):
    """Writes the process's parent pid to ``path``: how a probe was started (forked from the preloaded
    server, whose child it is, or a fresh interpreter, the tuner's own child)."""

    def __init__(self, path: str, n: int = 16, image_size: int = 16, num_classes: int = 10):
        import os

        super().__init__(n, image_size, num_classes, sleep_ms=0.0)
        with open(path, "w") as f:
            f.write(str(os.getppid()))


class SlowStartDataset(SlowDataset):
    """A planted fixed cost per epoch: each loader worker's first sample takes ``startup_s`` (opening
    files, connecting to storage), the rest are quick. Non-persistent workers pay it every epoch."""

    def __init__(self, n: int = 64, image_size: int = 16, num_classes: int = 10, startup_s: float = 1.0):
        super().__init__(n, image_size, num_classes, sleep_ms=0.0)
        self.startup_s = startup_s
        self._started_in = None

    def __getitem__(self, i):
        import os
        import time

        if self._started_in != os.getpid():
            self._started_in = os.getpid()
            time.sleep(self.startup_s)
        return super().__getitem__(i)


class SlowTransferModule(ProbeLightningModule):
    """A planted transfer bottleneck: every batch takes ``sleep_ms`` after reaching the device
    (standing in for a slow pageable copy, an nvJPEG decode or a normalize on the device)."""

    def __init__(self, num_classes: int = 10, lr: float = 0.01, sleep_ms: float = 40.0):
        super().__init__(num_classes, lr)
        self.sleep = sleep_ms / 1000

    def on_after_batch_transfer(self, batch, dataloader_idx):
        import time

        time.sleep(self.sleep)  # in validation too: that time must stay out of the training epoch
        return batch

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self(x).argmax(1) == y).float().mean())


class SlowBatchEndCallback(pl.Callback):
    """Batch-end work that is neither data nor transfer (a checkpoint save, a profiler export)."""

    def __init__(self, sleep_ms: float = 40.0):
        self.sleep = sleep_ms / 1000

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import time

        time.sleep(self.sleep)


class HookLightningModule(ProbeLightningModule):
    """A user's LightningModule with its own on_after_batch_transfer, recording what reaches it."""

    hook_dtypes: list = []

    def on_after_batch_transfer(self, batch, dataloader_idx):
        HookLightningModule.hook_dtypes.append(batch[0].dtype)
        return batch


class SignalNet(ProbeNet):
    """A planted stop signal per rank: in its ``at[rank]``-th training forward the rank sends
    ``signal_name`` to its own process, as a scheduler signals each node's step on its own clock
    (ranks reach a given step at different times, so "a few seconds apart" is "a few steps apart")."""

    def __init__(self, num_classes: int = 10, width: int = 8, signal_name: str = "SIGUSR1", at=(3,)):
        super().__init__(num_classes, width)
        self.signal_name = signal_name
        self.at = list(at)
        self.forwards = 0

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            import os
            import signal

            self.forwards += 1
            rank = int(os.environ.get("RANK", "0"))
            if rank < len(self.at) and self.forwards == self.at[rank]:
                os.kill(os.getpid(), signal.Signals[self.signal_name])
        return super().forward(x)


class RankValAccModule(ProbeLightningModule):
    """A user's own LightningModule that logs val_acc without ``sync_dist``, a different value on each
    rank: 0.125 per epoch plus 0.5 on rank 1 (exact in binary, so the mean over ranks is too)."""

    def validation_step(self, batch, batch_idx):
        self.log("val_acc", 0.125 * self.current_epoch + 0.5 * self.global_rank)


class ValLossOnlyModule(ProbeLightningModule):
    """A user's own LightningModule whose validation logs its loss and no accuracy."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))


def probe_lightning_module(num_classes: int = 10) -> ProbeLightningModule:
    """A factory function that returns a user's LightningModule (what it is shows only once it is built)."""
    return ProbeLightningModule(num_classes)


class StepLoopWatch(pl.Callback):
    """Watches a rank's training steps from inside: how many ``torch.distributed.broadcast`` calls they
    make (Lightning's per-step stop-flag read is one), how many rounds the trainer's stop agreement
    ran and how many of its reads had to wait; with ``sync_debug`` on a GPU, any host sync in the
    second epoch's steps raises. Writes ``step_loop_rank<N>.json`` into the run dir when training ends."""

    def __init__(self, sync_debug: bool = False) -> None:
        self.sync_debug = sync_debug
        self.steps = 0
        self.broadcasts = 0
        self._original = None

    def on_train_start(self, trainer, pl_module) -> None:
        import torch.distributed as dist

        self._original = dist.broadcast

        def counted(*args, **kwargs):
            self.broadcasts += 1
            return self._original(*args, **kwargs)

        dist.broadcast = counted

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.steps += 1
        if self.sync_debug and trainer.current_epoch == 1 and batch_idx == 0:
            torch.cuda.set_sync_debug_mode("error")

    def _sync_debug_off(self, *args, **kwargs) -> None:
        if self.sync_debug:
            torch.cuda.set_sync_debug_mode(0)

    on_validation_start = on_train_epoch_end = on_exception = _sync_debug_off

    def on_train_end(self, trainer, pl_module) -> None:
        import json
        import os

        import torch.distributed as dist

        from trainer.callbacks.checkpointing import PreemptionCallback

        dist.broadcast = self._original
        agreement = next(c for c in trainer.callbacks if isinstance(c, PreemptionCallback)).agreement
        record = dict(
            steps=self.steps, broadcasts=self.broadcasts, rounds=agreement.rounds, blocked=agreement.blocked_reads
        )
        path = os.path.join(trainer.default_root_dir, f"step_loop_rank{trainer.global_rank}.json")
        with open(path, "w") as f:
            json.dump(record, f)


class WatchedLightningModule(ProbeLightningModule):
    """A user's LightningModule whose steps a ``StepLoopWatch`` watches (it logs per epoch only: a
    per-step ``self.log`` is itself a host read every ``log_every_n_steps``)."""

    def __init__(self, num_classes: int = 10, lr: float = 0.01, sync_debug: bool = False):
        super().__init__(num_classes, lr)
        self.sync_debug = sync_debug

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_callbacks(self):
        return [StepLoopWatch(self.sync_debug)]


class PoolNet(nn.Module):
    """A network whose graph any input size can run: a per-pixel layer, then a global average. A
    compiler that turns a second size into a dynamic graph runs every later size on it (a conv
    net on the CPU does not show this: its convolutions specialize on the input size anyway)."""

    def __init__(self, num_classes: int = 10, width: int = 8):
        super().__init__()
        self.pixel = nn.Linear(3, width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.pixel(x.movedim(1, -1))).mean((1, 2)))


class SignalWatchedModule(WatchedLightningModule):
    """A ``WatchedLightningModule`` that also plants a stop signal per rank, as ``SignalNet`` does."""

    def __init__(self, num_classes: int = 10, lr: float = 0.01, signal_name: str = "SIGUSR1", at=()):
        super().__init__(num_classes, lr)
        self.signal_name = signal_name
        self.at = list(at)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        import os
        import signal

        self.steps += 1
        rank = int(os.environ.get("RANK", "0"))
        if rank < len(self.at) and self.steps == self.at[rank]:
            os.kill(os.getpid(), signal.Signals[self.signal_name])
        return super().training_step(batch, batch_idx)


class SlowValidationModule(SignalWatchedModule):
    """A ``SignalWatchedModule`` with a validation, whose first epoch's run lasts ``val_s`` seconds on
    every rank (a large evaluation set, a slow metric); rank 0 writes ``marker`` when it starts, so
    that a test can signal the job while it validates."""

    def __init__(self, num_classes: int = 10, lr: float = 0.01, val_s: float = 0.0, marker: str = ""):
        super().__init__(num_classes, lr)
        self.val_s = val_s
        self.marker = marker

    def on_validation_epoch_start(self):
        import time
        from pathlib import Path

        if self.trainer.sanity_checking or self.current_epoch != 0 or not self.val_s:
            return
        if self.global_rank == 0 and self.marker:
            Path(self.marker).write_text(str(time.time()))
        time.sleep(self.val_s)  # a stop signal's handler runs on the way; the sleep then goes on (PEP 475)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)
