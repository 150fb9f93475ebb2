"""The step loop reads no tensor on the host inside steady steps, checked on a CPU for every bench row
that runs here (``host_read_guard.HostReadGuard``; on a GPU, ``tests/gpu/test_sync_free.py``)."""

from __future__ import annotations

import pytest
from conftest import ROOT
from host_read_guard import HostReadGuard, HostReadInStep

ROWS = sorted(p.stem for p in (ROOT / "configs" / "bench").glob("*.yaml"))
HEAVY_ROWS = {"all", "all_turbo", "compile"}  # they compile (and all emulates bf16 on a CPU without it): make test only
# real JPEGs (the input rows need them), two short epochs: the second one's steps are checked
SMALL = [
    "data=imagefolder",
    "data.image_size=16",
    "data.batch_size=8",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=4",
    "trainer.limit_val_batches=1",
    "trainer.log_every_n_steps=1",  # StepLoss and NaNGuard ask for a value every step: the most reads
    "checkpoint.enabled=false",
    "compile_cache=shared",  # the compile row's graphs are the compile tests' (its cache has a test of its own)
    "batch_finder.max_batch_size=16",
    "monitor.interval_s=0.05",
]


def _runs_here(compose, args) -> str | None:
    """None where the row runs on this machine, else why not (a GPU-only row is refused up front)."""
    from trainer.errors import ConfigError
    from trainer.measure import hardware
    from trainer.switches import switchboard

    cfg = compose(*args)
    try:
        switchboard.resolve(cfg, hardware.detect(cfg.accelerator))
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    "row",
    [pytest.param(r, marks=[pytest.mark.slow, pytest.mark.heavy]) if r in HEAVY_ROWS else r for r in ROWS],
)
def test_no_host_read_inside_the_steady_steps_of_a_bench_row(row, train, compose, add_callbacks, small_images):
    if row == "all_nvimgcodec":  # nvjpeg_library picks a GPU decode: on a CPU both decode there, the all row
        pytest.skip("+bench=all_nvimgcodec runs as +bench=all without CUDA (data.decoder=nvjpeg falls back to the CPU)")
    if row == "dali":  # an optional extra: where it is not installed, the row is refused by design
        pytest.importorskip(
            "nvidia.dali", reason="the dali row needs NVIDIA DALI: pip install 'trainer-switchboard[dali]'"
        )
    args = [f"+bench={row}", *SMALL, f"data.root={small_images}"]
    refused = _runs_here(compose, args)
    if refused:
        pytest.skip(f"+bench={row} does not run on this machine: {refused}")
    guard = HostReadGuard()
    add_callbacks(guard, first=True)
    try:
        m, _ = train(*args, tiny=False)
    finally:
        guard.restore()
    assert m["status"] == "ok", m["error"]  # a host read in the checked steps fails the run, naming where
    assert guard.checked_steps >= 3, guard.checked_steps  # the check covered the second epoch's steps


def test_a_planted_per_step_item_is_caught(train, add_callbacks, monkeypatch):
    """The guard can fail: StepLoss reading the loss with .item() every step, as it would without HostReads."""
    from trainer.callbacks import step_loss

    def per_step_read(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.reads._values.append((trainer.global_step, loss.item()))

    monkeypatch.setattr(step_loss.StepLoss, "on_train_batch_end", per_step_read)
    guard = HostReadGuard()
    add_callbacks(guard, first=True)
    try:
        with pytest.raises(
            HostReadInStep, match=r"Tensor.item inside a steady training step, called from .*per_step_read"
        ):
            train("trainer.max_epochs=2")
    finally:
        guard.restore()
    assert guard.checked_steps == 1  # caught in the first checked step


def test_a_nan_found_inside_the_steady_steps_stops_the_run_without_a_host_read(train, add_callbacks, clear_spies):
    """NaNGuard stops with the values its deferred read brought to the host: reading its device record
    there again would wait for the GPU (an fp16 run on an H100 died of that sync instead of the NaN)."""
    from trainer.errors import TrainingStopped

    guard = HostReadGuard()
    add_callbacks(guard, first=True)
    try:
        with pytest.raises(TrainingStopped, match=r"non-finite training loss \(nan\) at step 10;"):
            train(
                "on_nan=stop", "model._target_=spies.ProbeNet", "~model.width", "+model.nan_after=10",
                "trainer.log_every_n_steps=1", "trainer.max_epochs=2",
            )  # fmt: skip
    finally:
        guard.restore()
    assert guard.checked_steps >= 2  # the NaN came, and was found, inside the checked (second) epoch
