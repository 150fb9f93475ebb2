"""Issue 'fit more, step faster': batch-size search, activation checkpointing, optimizer
implementations, zero_grad, lr scaling, the CUDA allocator setting, and peak memory."""

from __future__ import annotations

import os

import pytest
import pytorch_lightning as pl
import torch

RESNET18 = ["model._target_=torchvision.models.resnet18", "~model.width"]


def test_batch_size_auto_grows_with_the_memory_budget(train):
    small, _ = train(
        "data.batch_size=auto",
        "batch_finder.memory_budget_mb=40",
        "data.num_samples=1024",
        "data.image_size=32",
        "model.width=32",
    )
    large, _ = train(
        "data.batch_size=auto",
        "batch_finder.memory_budget_mb=400",
        "data.num_samples=1024",
        "data.image_size=32",
        "model.width=32",
    )
    assert small["flags"]["data.batch_size"] == "auto"
    assert small["batch_size"] < large["batch_size"]
    assert small["batch_size_reason"].startswith("memory") and small["status"] == "ok"
    assert small["epochs"][0]["samples"] == small["epochs"][0]["steps"] * small["batch_size"]


def test_batch_size_auto_stops_at_dataset_size_and_cap(train):
    m, _ = train("data.batch_size=auto", "data.num_samples=40", "batch_finder.memory_budget_mb=100000")
    assert m["batch_size"] == 32 and m["batch_size_reason"].startswith("dataset size")
    m, _ = train("data.batch_size=auto", "batch_finder.max_batch_size=16", "batch_finder.memory_budget_mb=100000")
    assert m["batch_size"] == 16 and m["batch_size_reason"].startswith("cap")


def test_batch_size_auto_is_single_device_only(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="single-process only"):
        train("data.batch_size=auto", "strategy=ddp")


def test_lr_scales_with_the_effective_batch(train):
    m, _ = train("lr_scaling=linear", "optim.lr=0.1", "optim.ref_batch_size=32", "data.batch_size=8", "accumulate=2")
    assert m["lr"] == pytest.approx(0.1 * 16 / 32)
    m, _ = train("lr_scaling=sqrt", "optim.lr=0.1", "optim.ref_batch_size=32", "data.batch_size=8")
    assert m["lr"] == pytest.approx(0.05)
    m, _ = train("optim.lr=0.1", "data.batch_size=8")
    assert m["lr"] == pytest.approx(0.1)


def test_activation_checkpointing_recomputes_blocks_in_backward(compose):
    from trainer.models import build_module
    from trainer.switches import model_transforms

    def conv_calls_per_step(flag: str) -> int:
        module = model_transforms.prepare_model(
            build_module(compose(*RESNET18, f"activation_checkpointing={flag}")),
            compose(f"activation_checkpointing={flag}"),
        )
        calls = []
        module.net.layer1[0].conv1.register_forward_hook(lambda *a: calls.append(1))
        loss = module(torch.randn(2, 3, 32, 32)).sum()
        loss.backward()
        return len(calls)

    assert conv_calls_per_step("false") == 1
    assert conv_calls_per_step("true") == 2  # once in forward, once recomputed in backward


def test_activation_checkpointing_leaves_the_batchnorm_statistics_as_they_are_without_it(compose):
    """The recomputation in backward runs each block's forward again in training mode: BatchNorm folded
    the batch into its running statistics twice and counted it twice, so the flag changed the eval
    model, not only memory."""
    from trainer.models import build_module
    from trainer.switches import model_transforms

    def buffers_after_a_step(flag: str) -> dict:
        torch.manual_seed(0)
        module = model_transforms.prepare_model(
            build_module(compose(*RESNET18, f"activation_checkpointing={flag}")),
            compose(f"activation_checkpointing={flag}"),
        )
        module.train()
        module(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))).sum().backward()
        return {k: v.clone() for k, v in module.state_dict().items() if "running" in k or "num_batches" in k}

    plain, checkpointed = buffers_after_a_step("false"), buffers_after_a_step("true")
    assert plain.keys() == checkpointed.keys() and plain
    for key in plain:
        assert torch.allclose(plain[key].float(), checkpointed[key].float(), atol=1e-6), key


def test_activation_checkpointing_trains_and_keeps_state_dict_keys(train, compose):
    from trainer.models import build_module
    from trainer.switches import model_transforms

    plain = build_module(compose(*RESNET18)).state_dict().keys()
    wrapped = (
        model_transforms.prepare_model(build_module(compose(*RESNET18)), compose("activation_checkpointing=true"))
        .state_dict()
        .keys()
    )
    assert list(plain) == list(wrapped)
    m, _ = train(*RESNET18, "activation_checkpointing=true")
    assert m["status"] == "ok" and m["flags"]["activation_checkpointing"] is True


def test_activation_checkpointing_without_blocks_is_a_clear_error(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="no repeated blocks"):
        train("activation_checkpointing=true")  # the tiny CNN has none


@pytest.mark.parametrize(
    "value,check",
    [
        ("true", lambda o: o.defaults["fused"] is True),
        ("foreach", lambda o: o.defaults["foreach"] is True),
        ("false", lambda o: o.defaults["foreach"] is False and not o.defaults["fused"]),
    ],
)
def test_optimizer_implementation(compose, value, check):
    from trainer.models.optimizers import build_optimizer

    for name in ("sgd", "adamw"):
        cfg = compose(f"optim.fused={value}", f"optim.name={name}")
        assert check(build_optimizer(torch.nn.Linear(4, 2), cfg.optim))


def test_auto_is_fused_on_a_gpu(compose):
    """On CUDA auto takes the fused kernels: one pass over the parameters per step where torch's own
    choice (foreach) makes several, and under fp16 loss scaling torch's GradScaler syncs the host every
    step with a non-fused optimizer (it reads found_inf on the host). Elsewhere: torch's own choice."""
    from trainer.models.optimizers import build_optimizer

    for name in ("sgd", "adamw"):
        cfg = compose(f"optim.name={name}").optim
        assert not build_optimizer(torch.nn.Linear(4, 2), cfg).defaults.get("fused")  # auto: torch's own choice
        assert build_optimizer(torch.nn.Linear(4, 2), cfg, on_cuda=True).defaults["fused"] is True
        assert build_optimizer(torch.nn.Linear(4, 2), cfg, loss_scaled_on_cuda=True).defaults["fused"] is True
        foreach = compose(f"optim.name={name}", "optim.fused=foreach").optim
        assert not build_optimizer(torch.nn.Linear(4, 2), foreach, loss_scaled_on_cuda=True).defaults.get(
            "fused"
        )  # asked for: kept


def test_fused_sgd_under_a_loss_scaler_survives_a_skipped_first_step(compose, monkeypatch):
    """fp16's first steps usually overflow and the scaler skips them; the fused kernel then writes
    nothing, and torch had made its momentum buffers with empty_like: the next step read whatever
    memory they held as momentum (NaN weights within ten steps on an H100). The skipped step must
    leave everything as it was, and the first real one must be the stock SGD update."""
    from trainer.models.optimizers import build_optimizer

    cfg = compose("optim.name=sgd", "optim.weight_decay=0").optim
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    before = [p.detach().clone() for p in model.parameters()]
    opt = build_optimizer(model, cfg, loss_scaled_on_cuda=True)
    assert opt.defaults["fused"] is True
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # the scale is made at the first loss scaled, as in a training step
    # what memory torch's empty_like hands the buffers holds is chance: make it the worst case
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: torch.full_like(t, float("nan"), **kw))
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    scaler.step(opt)  # overflow: skipped
    scaler.update()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    grads = [torch.randn_like(p) for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g * scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - cfg.lr * g)  # the first step's momentum is the gradient itself


def test_fused_sgd_keeps_zero_momentum_after_loading_a_state_without_any(compose):
    """Lightning loads a checkpoint's optimizer state after building the optimizer; a state saved before
    the first step has no momentum buffers, and loading it must not bring back torch's empty_like ones."""
    from trainer.models.optimizers import build_optimizer

    model = torch.nn.Linear(8, 8)
    opt = build_optimizer(model, compose("optim.name=sgd").optim, loss_scaled_on_cuda=True)
    saved = opt.state_dict()
    saved["state"] = {}  # as written before any step
    opt.load_state_dict(saved)
    buffers = [opt.state[p].get("momentum_buffer") for p in model.parameters()]
    assert buffers and all(b is not None and not b.any() for b in buffers), buffers


class GradsAfterStep(pl.Callback):
    """Each step's gradients as the optimizer stepped with them (after the step, before the next
    zero_grad): (their norm, their largest element)."""

    def __init__(self) -> None:
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.seen.append(
            (
                torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])).item(),
                max(g.abs().max().item() for g in grads),
            )
        )


def _fit_tiny_clipped(cfg, precision, algorithm: str = "norm"):
    """Four steps of the classifier on a tiny CNN with Lightning's own ``precision`` plugin, clipping at
    1e-3 on a CPU: (the trainer, each step's (gradient norm, largest gradient))."""
    from trainer.models.classifier import ImageClassifier
    from trainer.models.tiny import TinyCNN

    grads = GradsAfterStep()
    torch.manual_seed(0)
    model = ImageClassifier(TinyCNN(10, 8), cfg.optim, cfg.sched)
    data = torch.utils.data.TensorDataset(torch.randn(48, 3, 16, 16), torch.randint(0, 10, (48,)))
    trainer = pl.Trainer(
        accelerator="cpu",
        plugins=[precision],
        gradient_clip_val=1e-3,
        gradient_clip_algorithm=algorithm,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[grads],
    )
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    return trainer, grads.seen


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_reaches_the_step(train, add_callbacks, algorithm):
    """trainer.gradient_clip_val clips what the optimizer steps with (the classifier's
    configure_gradient_clipping: FSDP's own norm clipping under strategy=fsdp, Lightning's otherwise)."""
    grads = GradsAfterStep()
    seen = grads.seen
    add_callbacks(grads)
    m, _ = train(
        "trainer.gradient_clip_val=0.001", f"trainer.gradient_clip_algorithm={algorithm}", "trainer.max_epochs=1"
    )
    assert m["status"] == "ok" and seen
    norm, largest = max(seen)
    if algorithm == "norm":
        assert norm <= 0.001 * 1.01, norm
    else:
        assert largest <= 0.001 * 1.001 and norm > 0.002, (largest, norm)  # clipped element by element
    clipped = len(seen)
    m, _ = train("trainer.max_epochs=1")  # the same run unclipped: far larger gradients
    assert m["status"] == "ok" and max(n for n, _ in seen[clipped:]) > 0.01


def test_gradient_clipping_under_fp16_loss_scaling_with_a_fused_optimizer(compose):
    """fp16 picks a fused optimizer (its overflow check stays on the device), which unscales its own
    gradients in its step: Lightning refuses to clip them (its AMP plugin) or, under FSDP, clips them
    still scaled. The classifier unscales them first and clips what the step uses. Lightning's own
    fp16 plugin and torch's GradScaler, on a CPU (the trainer allows fp16 only on CUDA)."""
    from pytorch_lightning.plugins.precision import MixedPrecision

    cfg = compose("optim.name=sgd", "optim.fused=true", "sched.name=constant")
    trainer, seen = _fit_tiny_clipped(cfg, MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu")))
    assert trainer.optimizers[0].defaults["fused"] is True and len(seen) == 4
    assert all(0.5e-3 < norm <= 1.001e-3 for norm, _ in seen), seen  # unscaled, then clipped to the norm asked for


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_under_bf16_with_a_fused_optimizer(compose, algorithm):
    """bf16 has no loss scaler, but Lightning's AMP plugin refuses to clip for any optimizer that could
    unscale its own gradients (torch's fused kernels, which optim.fused=auto picks on CUDA): the ViT
    recipe (AdamW, clipping at 1.0) with amp failed at its first step on a GPU. The classifier clips
    them itself. Lightning's own bf16 plugin, on a CPU (torch has fused AdamW there too)."""
    from pytorch_lightning.plugins.precision import MixedPrecision

    cfg = compose("optim.name=adamw", "optim.fused=true", "sched.name=constant")
    trainer, seen = _fit_tiny_clipped(cfg, MixedPrecision("bf16-mixed", "cpu"), algorithm)
    assert trainer.optimizers[0].defaults["fused"] is True and len(seen) == 4
    if algorithm == "norm":
        assert all(norm <= 1.001e-3 for norm, _ in seen), seen
    else:
        assert all(largest <= 1.001e-3 and norm > 2e-3 for norm, largest in seen), seen


def test_fsdp1s_sharded_grad_scaler_steps_a_fused_adamw(compose):
    """strategy=fsdp with fp16 steps a fused AdamW: torch's ShardedGradScaler leaves its found-inf flag
    of shape (1,), which the fused step subtracted in place from its 0-d step counters ("output with
    shape [] doesn't match the broadcast shape [1]", pytorch/pytorch#140514). Lightning's FSDP fp16
    plugin with a real ShardedGradScaler, on a CPU (a one-process gloo group for its all-reduce; Lightning's
    FSDP strategy refuses CPUs): clipping makes the classifier unscale, as strategy=fsdp always does."""
    from pytorch_lightning.plugins.precision import FSDPPrecision
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from trainer.models.classifier import ImageClassifier
    from trainer.models.tiny import TinyCNN

    cfg = compose("optim.name=adamw", "optim.fused=true", "sched.name=constant")
    torch.manual_seed(0)
    model = ImageClassifier(TinyCNN(10, 8), cfg.optim, cfg.sched)
    before = [p.detach().clone() for p in model.parameters()]
    precision = FSDPPrecision("16-mixed")
    precision.scaler = ShardedGradScaler(device="cpu")  # its own would be a CUDA one, disabled here
    data = torch.utils.data.TensorDataset(torch.randn(24, 3, 16, 16), torch.randint(0, 10, (24,)))
    trainer = pl.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=1,
        plugins=[precision],
        gradient_clip_val=1.0,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    opt = trainer.optimizers[0]
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["fused"] is True and trainer.global_step == 3
    steps = [s["step"] for s in opt.state.values()]
    assert steps and all(s.shape == () and s.item() == 3 for s in steps), steps  # no step skipped for an overflow
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_fused_falls_back_with_a_message(compose, caplog):
    from trainer.models.optimizers import build_optimizer

    cfg = compose("optim.fused=true").optim
    opt = build_optimizer(torch.nn.Linear(4, 2), cfg)  # float parameters on the CPU: the fused kernel exists
    assert opt.defaults["fused"] is True and "using foreach instead" not in caplog.text
    meta = torch.nn.Linear(4, 2, device="meta")  # no fused kernel on this device (torch would only say so at step())
    opt = build_optimizer(meta, cfg)
    assert not opt.defaults.get("fused") and opt.defaults["foreach"] is True
    assert "using foreach instead" in caplog.text


def test_zero_grad_to_none_switch(train):
    seen = {}

    class Watch(pl.Callback):
        def on_before_backward(self, trainer, pl_module, loss):  # after zero_grad, before backward
            if trainer.global_step == 1:
                seen["grad"] = next(pl_module.parameters()).grad

    original = pl.Trainer.__init__

    def init(self, *a, callbacks=None, **kw):
        original(self, *a, callbacks=list(callbacks or []) + [Watch()], **kw)

    for flag, expect_none in (("true", True), ("false", False)):
        pl.Trainer.__init__ = init
        try:
            train(f"optim.zero_grad_to_none={flag}")
        finally:
            pl.Trainer.__init__ = original
        assert (seen["grad"] is None) == expect_none


def test_cuda_alloc_conf_reaches_the_environment_before_cuda_init(train, monkeypatch):
    """The allocator reads PYTORCH_CUDA_ALLOC_CONF when CUDA starts, and on a GPU hardware.detect() is
    the first thing that starts it (it asks the device's name and capability): the variable must be
    set before that call. (tests/gpu checks the allocator really runs with it.)"""
    from trainer.measure import hardware

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    seen_at_detect = []
    real = hardware.detect
    monkeypatch.setattr(
        hardware, "detect", lambda *a: seen_at_detect.append(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")) or real(*a)
    )
    m, _ = train("model._target_=spies.ProbeNet", "~model.width", "cuda_alloc_conf=expandable_segments:True")
    assert seen_at_detect and seen_at_detect[0] == "expandable_segments:True", seen_at_detect
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert m["flags"]["cuda_alloc_conf"] == "expandable_segments:True"
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF")


def test_peak_memory_is_per_run_not_per_interpreter(train):
    ballast = bytearray(300 * 2**20)  # the interpreter already holds 300 MB more than the run needs
    ballast[::4096] = b"x" * len(ballast[::4096])
    m, _ = train()
    del ballast
    assert m["peak_memory_mb"] < 250, m["peak_memory_mb"]
    assert "VmHWM reset" in m["peak_memory_method"]


def test_step_loss_reaches_tensorboard_every_log_every_n_steps(train):
    """train/loss is written by StepLoss (read without a device sync) at every log_every_n_steps-th optimizer step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m, out = train("trainer.log_every_n_steps=3", "data.num_samples=96", "trainer.max_epochs=2")  # 12 steps per epoch
    events = EventAccumulator(str(out))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == list(range(3, 25, 3)), steps
    assert all(e.value > 0 for e in events.Scalars("train/loss"))
    assert "train/loss_epoch" in events.Tags()["scalars"]


def test_a_resume_records_the_lr_it_trains_at_the_checkpoints(compose, tmp_path, caplog):
    """Lightning restores the optimizer and its schedule, base lr included: a resume at another batch
    (lr_scaling=linear) trained at the checkpoint's lr while metrics.json recorded the new config's."""
    from conftest import TINY

    from trainer.run import run

    out = tmp_path / "run"
    first = run(compose(*TINY, "lr_scaling=linear", "data.batch_size=8", "checkpoint.enabled=true"), str(out))
    resume = [*TINY, "lr_scaling=linear", "checkpoint.enabled=true", "ckpt_path=last", "trainer.max_epochs=2"]
    resumed = run(compose(*resume, "data.batch_size=16"), str(out))
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    ran = ckpt["optimizer_states"][0]["param_groups"][0]["initial_lr"]
    assert resumed["lr"] == pytest.approx(first["lr"]) == pytest.approx(ran), (first["lr"], resumed["lr"], ran)
    assert "resuming at the checkpoint's lr" in caplog.text and "not this config's" in resumed["lr_note"]
