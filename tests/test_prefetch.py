"""data.device_prefetch on this machine: the prefetching loader runs stream-less on the CPU (the
datamodule uses it only on CUDA, so these tests point ``_prefetch_device`` at the CPU). What only a
GPU can show (streams, record_stream, reserved memory) is in tests/gpu/test_cuda.py."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

PREFETCH_THREAD = "trainer-device-prefetch"


@pytest.fixture
def prefetch_here(monkeypatch):
    """data.device_prefetch=true builds the prefetching loader on the CPU."""
    from trainer.data import datamodule as dm_mod

    monkeypatch.setattr(dm_mod.ImageDataModule, "_prefetch_device", lambda self: torch.device("cpu"))


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
