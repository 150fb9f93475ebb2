"""data.device_prefetch on this machine: the prefetching loader runs stream-less on the CPU (the
datamodule uses it only on CUDA, so these tests point ``TorchLoaders.prefetch_device`` at the CPU). What only a
GPU can show (streams, record_stream, reserved memory) is in tests/gpu/test_cuda.py."""

from __future__ import annotations

import collections
import dataclasses
import multiprocessing
import threading
from collections.abc import Mapping

import pytest
import torch

from trainer.errors import ConfigError

PREFETCH_THREAD = "trainer-device-prefetch"


@pytest.fixture
def prefetch_here(monkeypatch):
    """data.device_prefetch=true builds the prefetching loader on the CPU."""
    from trainer.data.loaders.torch_workers import TorchLoaders

    monkeypatch.setattr(TorchLoaders, "prefetch_device", lambda self: torch.device("cpu"))


def _prefetch_threads() -> list:
    return [t for t in threading.enumerate() if t.name == PREFETCH_THREAD]


def test_a_failed_fit_leaves_no_prefetch_thread_or_loader_worker_behind(train, monkeypatch, prefetch_here):
    """A fit that fails stops its prefetch thread, drops the batches it prepared and shuts down its
    loader's workers, before the next job of a local sweep starts beside them.

    Lightning's clean-up after a failure drops the loader's iterator (and with it the thread) only
    if it gets that far: after a CUDA error every later CUDA call fails too, and it raises again
    when it moves the model to the CPU. Planted here: the step fails as a device error does, and the
    model's move to the CPU after it. The error stays referenced, as a local sweep keeps each job's
    error for its report (and with it the failed fit)."""
    from trainer.models.classifier import ImageClassifier

    failed = []
    real_step, real_cpu = ImageClassifier.training_step, ImageClassifier.cpu

    def step(self, batch, batch_idx):
        if batch_idx == 2:
            failed.append(batch_idx)
            raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")
        return real_step(self, batch, batch_idx)

    def cpu(self):
        if failed:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (planted, again)")
        return real_cpu(self)

    monkeypatch.setattr(ImageClassifier, "training_step", step)
    monkeypatch.setattr(ImageClassifier, "cpu", cpu)
    with pytest.raises(RuntimeError, match="planted") as error:
        train("data.device_prefetch=true", "data.num_samples=128", "data.num_workers=1")
    assert failed == [2] and error.value is not None  # failed in its third step; the error is still held
    assert not _prefetch_threads()
    assert not multiprocessing.active_children()  # the loader's worker process


@dataclasses.dataclass
class _Pair:
    images: torch.Tensor
    labels: torch.Tensor
    note: str = "dataclass"


_Named = collections.namedtuple("_Named", "x extra")


class _ReadOnly(Mapping):
    """A mapping that is not a dict (as a tokenizer's batch is a UserDict)."""

    def __init__(self, **items):
        self._items = items

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def test_every_tensor_of_a_batch_is_found_in_the_containers_lightning_moves():
    """record_stream reaches only the tensors this walk finds: one it misses can be overwritten by the
    next copy while the step reads it. Lightning moves tensors inside mappings, namedtuples, other
    sequences and dataclasses (and a dataclass batch arrives on the device that way)."""
    from trainer.data.prefetch import tensors_in

    t = [torch.full((2,), float(i)) for i in range(8)]
    batch = {
        "pair": _Pair(t[0], t[1]),
        "named": _Named(t[2], [t[3], (t[4], "text", 3, None)]),
        "mapping": _ReadOnly(a=t[5], nested=_Pair(t[6], t[7])),
    }
    assert sorted(int(x[0]) for x in tensors_in(batch)) == list(range(8))


class _Opaque:
    """A batch type that Lightning moves with its own .to(), its tensors out of sight."""

    def __init__(self, x):
        self._x = x

    def to(self, *args, **kwargs):
        return _Opaque(self._x.to(*args, **kwargs))


def test_a_batch_that_hides_its_tensors_behind_to_is_refused_in_one_paragraph():
    from trainer.data.prefetch import DevicePrefetchLoader

    loader = DevicePrefetchLoader(
        [torch.zeros(2)] * 4,
        batch_size=2,
        device=torch.device("cpu"),
        collate_fn=lambda items: _Opaque(torch.stack(items)),
    )
    with pytest.raises(ConfigError) as refused:
        next(iter(loader))
    message = str(refused.value)
    assert "_Opaque" in message and "data.device_prefetch=false" in message and "\n" not in message
    assert not _prefetch_threads()  # the producer stopped with the refusal
    pair = DevicePrefetchLoader(
        [torch.zeros(2)] * 4, batch_size=2, device=torch.device("cpu"), collate_fn=lambda b: _Pair(*b)
    )
    assert [type(b) for b in pair] == [_Pair, _Pair]  # a dataclass batch is welcome


def _crops(stop_at=None):
    """The images of every training batch, by (epoch, batch index); stops the fit at ``stop_at``."""
    from spies import BatchRecorder

    return BatchRecorder(lambda batch: batch[0].clone(), stop_at)


@pytest.mark.parametrize(
    "prefetch, decode",
    [(True, "pil"), (False, "pil"), (True, "nvjpeg")],
    ids=["device_prefetch", "plain", "device_prefetch-device_decode"],
)
def test_a_run_resumed_mid_epoch_sees_the_crops_of_the_uninterrupted_run(
    train, monkeypatch, add_callbacks, tmp_path, prefetch, decode
):
    """Random crops and flips drawn in this process, stopped after a mid-epoch checkpoint and resumed.
    With data.device_prefetch the producer thread has drawn the crops of the batches it prepared
    ahead by the time the checkpoint is saved; without it, the resumed fit makes a new loader
    iterator (which draws its base seed) before its first batch: either way the saved RNG state no
    longer matched the next batch's draws, and the resumed run trained on other crops. With
    data.decoder=nvjpeg the crops are drawn on the host in the transfer (the prefetch thread's),
    after the loader workers."""
    from trainer.data.loaders.torch_workers import TorchLoaders

    if prefetch:
        monkeypatch.setattr(TorchLoaders, "prefetch_device", lambda self: torch.device("cpu"))
    if decode == "nvjpeg":  # the data.decoder=nvjpeg path with torchvision's CPU decoder
        from trainer.data import decoders

        real = decoders.resolve_decoder
        monkeypatch.setattr(
            decoders, "resolve_decoder", lambda name, accelerator: name if name == "nvjpeg" else real(name, accelerator)
        )
    args = [
        "data=builtin",
        "data.images_per_class=8",
        "data.stored_size=40",
        "data.batch_size=4",
        # with the device decode the crops are drawn in the transfer, in the prefetch thread, workers or not
        f"data.num_workers={1 if decode == 'nvjpeg' else 0}",
        f"data.decoder={decode}",
        "data.augment=true",
        "trainer.max_epochs=2",
        f"data.device_prefetch={str(prefetch).lower()}",
        "checkpoint.enabled=true",
        "checkpoint.every_n_steps=5",
    ]
    straight = _crops()
    add_callbacks(straight)
    assert train(*args)[0]["status"] == "ok"
    add_callbacks(_crops(stop_at=(0, 7)))  # two steps after the checkpoint of step 5
    with pytest.raises(RuntimeError, match="on purpose"):
        train(*args)
    resumed = _crops()
    add_callbacks(resumed)
    assert train(*args, f"ckpt_path={tmp_path / 'run2' / 'checkpoints' / 'last.ckpt'}")[0]["status"] == "ok"
    assert min(resumed.seen) == (0, 5) and max(resumed.seen) == max(straight.seen) == (1, len(straight.seen) // 2 - 1)
    differ = [at for at, x in resumed.seen.items() if not torch.equal(x, straight.seen[at])]
    assert not differ, differ


class _Draws(torch.utils.data.Dataset):
    """A sample is what the global RNGs give at the time it is fetched (as random transforms draw)."""

    def __len__(self):
        return 100

    def __getitem__(self, index):
        import random

        import numpy as np

        return (torch.rand(()).item(), random.random(), float(np.random.rand()))


def test_seeded_samples_draw_by_epoch_and_index_and_leave_the_process_rngs_as_they_were():
    import random

    import numpy as np

    from trainer.data.seeding import SeededSamples

    epoch = [0]
    data = SeededSamples(_Draws(), seed=7, epoch_of=lambda: epoch[0])
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    first = data.__getitems__([3, 4, 5])
    after = torch.get_rng_state(), random.getstate(), np.random.get_state()[1]
    assert torch.equal(before[0], after[0]) and before[1] == after[1] and (before[2] == after[2]).all()
    assert data.__getitems__([5, 9]) == [first[2], data[9]]  # a sample's draws: its own, whatever else is fetched
    assert len({v for sample in first for v in sample}) == 9  # samples, and the three RNGs, all differ
    epoch[0] = 1
    assert all(a != b for a, b in zip(data.__getitems__([3, 4, 5]), first))  # and a new epoch draws anew
