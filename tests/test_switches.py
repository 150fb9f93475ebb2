"""Every switchboard flag changes what runs: proven from inside the forward pass or the trainer."""

from __future__ import annotations

import pytest
import spies
import torch
from conftest import TINY
from spies import training_snapshots

PROBE = ["model._target_=spies.ProbeNet", "~model.width"]
pytestmark = pytest.mark.usefixtures("clear_spies")


def test_baseline_runs_fp32_contiguous(train):
    metrics, _ = train(*PROBE)
    seen = training_snapshots()
    assert seen and all(s["conv_out_dtype"] == torch.float32 and not s["autocast"] for s in seen)
    assert not any(s["input_channels_last"] or s["weight_channels_last"] for s in seen)
    assert metrics["status"] == "ok" and metrics["precision"] == "32-true"


def test_amp_autocasts_to_bf16_on_cpu(train):
    metrics, _ = train(*PROBE, "amp=true")
    seen = training_snapshots()
    assert seen and all(s["autocast"] and s["conv_out_dtype"] == torch.bfloat16 for s in seen)
    assert metrics["flags"]["amp"] is True and metrics["precision"] == "bf16-mixed"


def test_amp_dtype_bf16_explicit(train):
    metrics, _ = train(*PROBE, "amp=true", "amp_dtype=bf16")
    seen = training_snapshots()
    assert seen and all(s["conv_out_dtype"] == torch.bfloat16 for s in seen)
    assert metrics["flags"]["amp_dtype"] == "bf16"


def test_amp_dtype_fp16_is_refused_on_cpu(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="amp_dtype=fp16"):
        train(*PROBE, "amp=true", "amp_dtype=fp16")


def test_bf16_without_native_support_warns(compose, caplog):
    from trainer.measure.hardware import Hardware
    from trainer.switches import switchboard

    slow_cpu = Hardware("cpu", "test cpu", 1, 2, bf16_native=False, fp16=False)
    plan = switchboard.resolve(compose("amp=true"), slow_cpu)
    assert any("SLOWER than fp32" in w for w in plan.warnings)
    fast_cpu = Hardware("cpu", "test cpu", 1, 2, bf16_native=True, fp16=False)
    assert not switchboard.resolve(compose("amp=true"), fast_cpu).warnings


def test_channels_last_converts_weights_and_inputs(train):
    metrics, _ = train(*PROBE, "channels_last=true")
    seen = training_snapshots()
    assert seen and all(s["weight_channels_last"] and s["input_channels_last"] for s in seen)
    assert metrics["flags"]["channels_last"] is True


def test_compile_compiles_the_model(train, monkeypatch):
    import torch._dynamo

    modes = []
    real_compile = torch.compile

    def spy(model, **kwargs):
        compiled = getattr(model, "__self__", model)  # nn.Module.compile() hands over its bound _call_impl
        if type(compiled).__name__ == "TinyCNN":  # the model's network (not the compiler's warm-up net)
            modes.append(kwargs.get("mode"))
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    metrics, _ = train(
        "compile=true", "compile_cache=shared", "compile_mode=max-autotune-no-cudagraphs", "model.width=4"
    )
    assert modes == ["max-autotune-no-cudagraphs"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo really captured graphs
    assert metrics["status"] == "ok" and metrics["flags"]["compile"] is True


def test_compile_backend_picks_torch_compiles_backend_and_a_mode_only_goes_with_inductor(train, monkeypatch, compose):
    import torch._dynamo

    from trainer.config import validate
    from trainer.errors import ConfigError

    backends = []
    real_compile = torch.compile

    def spy(model, **kwargs):
        if type(getattr(model, "__self__", model)).__name__ == "TinyCNN":
            backends.append(kwargs.get("backend"))
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    metrics, run_dir = train("compile=true", "compile_backend=aot_eager", "model.width=4")
    assert backends == ["aot_eager"] and metrics["flags"]["compile_backend"] == "aot_eager"
    assert torch._dynamo.utils.counters["aot_autograd"]["total"] >= 1 and not torch._dynamo.utils.counters["inductor"]
    assert metrics["status"] == "ok" and metrics["compile_time_s"] > 0
    with pytest.raises(ConfigError, match="'compile_mode=max-autotune' is a mode of the inductor backend"):
        validate(compose("compile=true", "compile_backend=aot_eager", "compile_mode=max-autotune"))


COMPILE = [
    "compile=true",
    "compile_cache=shared",  # warm across tests: the cache's own test below compiles cold
    "model.width=4",
    "data.num_samples=64",
    "data.val_samples=32",
]  # every batch full: no in-job shape change


def test_a_sweeps_second_compile_job_compiles_as_if_it_ran_alone(train):
    """Two compile=true jobs in one process (a local sweep): the second starts from a clean dynamo,
    so it neither reuses the first job's graphs nor recompiles them with a dynamic batch size, and
    only the network is traced, never Lightning's training_step or self.log."""
    import torch._dynamo
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import guard_failures

    first, _ = train(*COMPILE, "data.batch_size=16")
    assert first["status"] == "ok"
    second, _ = train(*COMPILE, "data.batch_size=32")
    compiled = {
        ref().co_name for ref in convert_frame.input_codes.seen if ref() is not None
    }  # since the second job began
    reasons = [str(r) for failures in guard_failures.values() for r in failures]
    # the network's forward (through ModelInput's conversion at its start: one frame with it)
    assert second["status"] == "ok" and compiled & {"forward", "_forward_with_input"}, compiled
    assert not compiled & {"training_step", "validation_step", "log", "_log_dict"}, compiled
    assert not any("size mismatch" in r or "expected 16" in r for r in reasons), (
        reasons
    )  # nothing of the first job's batch
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


@pytest.mark.slow
@pytest.mark.heavy
def test_progressive_resize_with_compile_compiles_a_static_graph_per_size_and_counts_every_compile(train):
    """Sizes 8, 12, 16: each new size compiles a static graph of its own in its epoch's first step
    (dynamo's automatic dynamic shapes would have compiled 12 as a dynamic graph and run the final
    full-size epoch on it, compiling nothing there: shown with a network any size can run, as GPU
    conv nets can; on the CPU Inductor's convolutions specialize on the size anyway), and
    compile_time_s counts every compiling step, not the first one alone; time to target counts what
    the run paid before its first epoch."""
    m, _ = train(
        "compile=true", "compile_cache=shared", "model._target_=spies.PoolNet", "model.width=4",
        "progressive_resize=true", "progressive.start_size=8",
        "progressive.bucket=4", "progressive.end_epoch=2", "trainer.max_epochs=3", "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=0", "data.val_samples=0",
    )  # fmt: skip
    assert m["status"] == "ok", m["error"]
    epochs = m["epochs"]
    assert [e["image_size"] for e in epochs] == [8, 12, 16]
    assert [e.get("compiling_steps", 0) for e in epochs] == [1, 1, 1]  # the full size got its own graph
    assert all(e["compile_s"] > 0 for e in epochs)
    assert m["compile_time_s"] == pytest.approx(sum(e["compile_s"] for e in epochs), abs=2e-3)
    assert m["compile_time_s"] > epochs[0]["compile_s"]  # the recompiles count too
    assert m["compile_cache"] == "shared" and m["compile_warmup_s"] > 0
    assert epochs[0]["setup_s"] >= m["compile_warmup_s"]  # the warm-up is paid inside fit, before epoch 0
    assert epochs[0]["elapsed_train_s"] == pytest.approx(epochs[0]["time_s"] + epochs[0]["setup_s"], abs=1e-3)


def test_compile_time_counts_the_evaluation_graph_the_first_validation_compiled(train):
    """The first validation compiles a graph of its own (eval mode, no grad): its compiling batch's
    time beyond a plain one is the epoch's val_compile_s, in compile_time_s beside the training
    steps' compile, and time to target counts it as training time (not as validation, which it
    leaves out). The second epoch's validation reuses the graph and compiles nothing."""
    m, _ = train(*COMPILE, "compile_backend=aot_eager", "data.batch_size=16", "trainer.max_epochs=2")
    assert m["status"] == "ok", m["error"]
    first, second = m["epochs"]
    assert first["val_compiling_steps"] == 1 and first["val_compile_s"] > 0
    assert "val_compile_s" not in second and "val_compiling_steps" not in second
    assert m["val_compile_s"] == pytest.approx(first["val_compile_s"], abs=1e-3)
    assert m["compile_time_s"] == pytest.approx(first["compile_s"] + first["val_compile_s"], abs=2e-3)
    assert first["val_compile_s"] <= first["val_time_s"]
    train_s = first["time_s"] + first["setup_s"] + first["val_compile_s"]
    assert first["elapsed_train_s"] == pytest.approx(train_s, abs=1e-3)
    assert first["elapsed_val_s"] == pytest.approx(first["val_time_s"] - first["val_compile_s"], abs=1e-3)


def test_a_smaller_last_validation_batch_compiles_no_graph_of_its_own(train, add_callbacks):
    """20 validation samples in batches of 8: the last batch holds 4. Evaluation's batch dimension is
    dynamic, so the graph the first batch compiled serves it; a static one would be compiled again
    for it (dynamo's automatic dynamic shapes), a second compile in the first validation. Counted by
    dynamo's own graph counter around each validation batch."""
    import pytorch_lightning as pl
    from torch._dynamo.utils import counters

    class GraphsPerBatch(pl.Callback):
        def __init__(self):
            self.seen = []

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            self.before = counters["stats"]["unique_graphs"]

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            self.seen.append((len(batch[1]), counters["stats"]["unique_graphs"] - self.before))

    spy = GraphsPerBatch()
    add_callbacks(spy)
    m, _ = train(*COMPILE, "compile_backend=aot_eager", "data.batch_size=8", "data.val_samples=20")
    assert m["status"] == "ok", m["error"]
    assert [size for size, _ in spy.seen] == [8, 8, 4]
    assert spy.seen[0][1] >= 1 and [graphs for _, graphs in spy.seen[1:]] == [0, 0], spy.seen
    assert m["epochs"][0]["val_compiling_steps"] == 1


def test_the_compiler_warm_up_runs_on_the_given_device_and_draws_no_random_numbers(train, add_callbacks, monkeypatch):
    """The warm-up compiles on the rank's device as the strategy knows it (under srun no LOCAL_RANK says
    which GPU is the rank's), and leaves the job's random state as it found it."""
    import pytorch_lightning as pl

    from trainer.switches import model_transforms

    seen = []
    real = model_transforms.warm_up_compiler

    def spy(device, backend="inductor"):
        seen.append(device)
        return real(device, backend)

    class Root(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            seen.append(trainer.strategy.root_device)

    monkeypatch.setattr(model_transforms, "warm_up_compiler", spy)
    add_callbacks(Root(), first=True)
    m, _ = train(*COMPILE, "data.batch_size=16")
    assert m["status"] == "ok" and len(seen) == 2 and seen[1] == seen[0], seen

    torch.manual_seed(0)
    real(torch.device("cpu"))
    after_warm_up = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), after_warm_up)


_FIRST_STEP_IMPORTS = """
import json, sys
import pytorch_lightning as pl
from trainer import run as run_mod
from trainer.config.compose import compose_for_run
from trainer.run import build as run_build

seen = {}


class Imports(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        seen.setdefault("before", set(sys.modules))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        seen.setdefault("after", set(sys.modules))


real = run_build.build_callbacks
run_build.build_callbacks = lambda parts: (lambda found: (found.all.append(Imports()), found)[1])(real(parts))
args = sys.argv[2:]
m = run_mod.run(compose_for_run(args), sys.argv[1], args)
# the compiler's own modules; not the job's generated code, which Inductor loads as modules under compile_tasks
new = sorted(
    n for n in seen["after"] - seen["before"]
    if n.startswith(("torch._inductor", "torch._dynamo")) and not n.startswith("torch._inductor.runtime.compile_tasks.")
)
print(json.dumps({"status": m["status"], "error": m["error"], "first_step_imports": new}))
"""


@pytest.mark.slow
def test_the_compiler_warm_up_leaves_only_the_jobs_graphs_to_its_first_step(tmp_path):
    """The warm-up's effect, in a fresh process (where the compiler has not started): by the first
    training step the compiler's per-process start-up is done, so that step loads none of dynamo's or
    Inductor's modules (without the warm-up it loads dozens: time that the same job run after
    another one in a local sweep would not pay, and compile_time_s would differ between the two)."""
    import json
    import subprocess
    import sys

    from conftest import clean_env

    args = [*__import__("conftest").TINY, *COMPILE, "data.batch_size=16"]
    r = subprocess.run(
        [sys.executable, "-c", _FIRST_STEP_IMPORTS, str(tmp_path / "run"), *args],
        capture_output=True, text=True, env=clean_env(), timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["status"] == "ok", seen["error"]
    assert seen["first_step_imports"] == [], seen["first_step_imports"]


@pytest.mark.slow
def test_each_compile_job_compiles_cold_in_its_own_cache_and_a_resume_finds_its_graphs(train, compose, add_callbacks):
    """Inductor's on-disk cache survives torch.compiler.reset(): two identical jobs in one process (a
    local sweep's repeats) shared it, so the second read its graphs from the first's files. Each job
    has its own (<run dir>/compile_cache): the second compiles cold, a resume of the first finds them."""
    import pytorch_lightning as pl
    from torch._dynamo.utils import counters

    from trainer.run import run

    def hits() -> int:
        return counters["inductor"]["fxgraph_cache_hit"]

    class Hits(pl.Callback):  # after the compiler's warm-up (whose throwaway graphs use the shared cache)
        def on_fit_start(self, trainer, pl_module):
            self.before = hits()

        def on_fit_end(self, trainer, pl_module):
            self.job = hits() - self.before

    watch = Hits()
    add_callbacks(watch)
    args = [c for c in COMPILE if not c.startswith("compile_cache")] + ["data.batch_size=16", "checkpoint.enabled=true"]
    first, first_dir = train(*args)
    second, second_dir = train(*args)
    assert first["status"] == second["status"] == "ok"
    assert first["compile_cache"] == second["compile_cache"] == "cold"
    assert watch.job == 0  # nothing of the first job's graphs came from disk
    assert any((second_dir / "compile_cache").iterdir()) and any((first_dir / "compile_cache").iterdir())
    resumed_args = [*TINY, *args, "ckpt_path=last", "trainer.max_epochs=2"]
    resumed = run(compose(*resumed_args), str(first_dir), resumed_args)
    assert resumed["status"] == "ok" and resumed["compile_cache"] == "warm"
    assert watch.job > 0  # the resumed job's graphs came from its own cache


def test_compile_reaches_a_users_lightning_module_under_fsdp2(train):
    """strategy=fsdp2: the user's configure_model shards, then the trainer compiles the network in place."""
    import torch._dynamo
    from spies import ShardedProbeLightningModule

    ShardedProbeLightningModule.states.clear()
    try:
        metrics, _ = train(
            "model._target_=spies.ShardedProbeLightningModule",
            "~model.width",
            "strategy=fsdp2",
            "devices=1",
            "compile=true",
            "compile_cache=shared",
        )
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert metrics["status"] == "ok", metrics["error"]
    # sharded by the user's configure_model while still eager, compiled once sharded
    assert ShardedProbeLightningModule.states == [
        ("configure_model", "ProbeNet", False),
        ("on_train_start", "FSDPProbeNet", True),
    ]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo traced the user's network
    assert not training_snapshots()  # a compiled forward runs no Python: no eager training step recorded one


def test_accumulate_steps_the_optimizer_every_n_batches(train, compose, tmp_path):
    from trainer.run import run

    steps = {}
    for n in (1, 4):
        cfg = compose(*__import__("conftest").TINY, f"accumulate={n}", "data.num_samples=128")
        import pytorch_lightning as pl

        class CountSteps(pl.Callback):
            count = 0

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):
                CountSteps.count += 1

        # count optimizer steps through a callback injected via the Trainer class
        original = pl.Trainer.__init__

        def init(self, *a, callbacks=None, _original=original, **kw):
            _original(self, *a, callbacks=list(callbacks or []) + [CountSteps()], **kw)

        pl.Trainer.__init__ = init
        try:
            metrics = run(cfg, str(tmp_path / f"acc{n}"))
        finally:
            pl.Trainer.__init__ = original
        steps[n] = CountSteps.count
        assert metrics["flags"]["accumulate"] == n
    assert steps == {1: 16, 4: 4}  # 128 samples / batch 8 = 16 batches


def test_tf32_and_cudnn_benchmark_reach_the_forward_pass(train):
    train(*PROBE, "tf32=true", "cudnn_benchmark=true")
    seen = training_snapshots()
    assert seen and all(s["matmul_precision"] == "high" and s["cudnn_benchmark"] for s in seen)
    spies.SEEN.clear()
    metrics, _ = train(*PROBE)
    seen = training_snapshots()
    assert seen and all(s["matmul_precision"] == "highest" and not s["cudnn_benchmark"] for s in seen)
    assert metrics["flags"]["tf32"] is False and metrics["flags"]["cudnn_benchmark"] is False


def test_profile_writes_a_clean_trace(train):
    metrics, out = train(
        "profile=true",
        "data.num_samples=96",
        "profiler.skip_first=1",
        "profiler.wait=1",
        "profiler.warmup=1",
        "profiler.active=2",
    )
    traces = list((out / "profiler").glob("*.pt.trace.json"))
    assert len(traces) == 1 and "[" not in traces[0].name and traces[0].name.startswith("rank0")
    assert metrics["flags"]["profile"] is True


def test_memory_snapshot_needs_cuda_and_says_so(train, caplog):
    metrics, out = train("profile=true", "profiler.memory_snapshot=true", "data.num_samples=96")
    assert metrics["status"] == "ok" and "needs CUDA" in caplog.text
    assert not list((out / "profiler").glob("memory_snapshot*"))


def test_strategy_ddp_initializes_a_process_group(train):
    metrics, _ = train(*PROBE, "strategy=ddp", "devices=1")
    seen = training_snapshots()
    assert seen and all(s["distributed"] for s in seen)
    assert metrics["status"] == "ok" and metrics["flags"]["strategy"] == "ddp"
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_strategy_fsdp2_shards_the_model(train):
    metrics, _ = train(*PROBE, "strategy=fsdp2", "devices=1")
    seen = training_snapshots()
    assert seen and all(s["distributed"] and s["module_class"] == "FSDPProbeNet" for s in seen)
    assert metrics["status"] == "ok" and metrics["flags"]["strategy"] == "fsdp2"
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_fsdp2_with_channels_last_is_refused_up_front(train, monkeypatch):
    """FSDP2's fully_shard refuses non-contiguous (channels-last) parameters: say so before data or model are built."""
    from trainer.data import ImageDataModule
    from trainer.errors import ConfigError

    built, real = [], ImageDataModule.build
    monkeypatch.setattr(ImageDataModule, "build", lambda self: built.append(1) or real(self))
    with pytest.raises(ConfigError, match="'strategy=fsdp2' cannot shard channels-last weights"):
        train(*PROBE, "strategy=fsdp2", "devices=1", "channels_last=true")
    assert not built


def test_fsdp1_with_channels_last_is_refused_where_it_would_not_shard(fake_gpu, compose):
    """Unsharded, FSDP1 hands channels-last weights their gradients in the wrong element order
    (tests/test_distributed.py::test_fsdp1_trains_channels_last_weights_right_only_when_it_shards): one GPU,
    NO_SHARD, or HYBRID_SHARD with one GPU per node is refused before anything is built; sharded it runs."""
    from trainer.errors import ConfigError
    from trainer.switches import switchboard

    two = fake_gpu("NVIDIA H100 80GB HBM3", (9, 0), count=2)
    fsdp = ["strategy=fsdp", "channels_last=true"]
    with pytest.raises(ConfigError, match=r"a shard group of one GPU \(FULL_SHARD\).*channels_last=false"):
        switchboard.resolve(compose(*fsdp, "devices=1"), two)
    with pytest.raises(ConfigError, match="with NO_SHARD"):
        switchboard.resolve(compose(*fsdp, "devices=2", "fsdp.sharding_strategy=NO_SHARD"), two)
    with pytest.raises(ConfigError, match=r"a shard group of one GPU \(HYBRID_SHARD\)"):
        switchboard.resolve(compose(*fsdp, "devices=1", "num_nodes=2", "fsdp.sharding_strategy=HYBRID_SHARD"), two)
    assert switchboard.resolve(compose(*fsdp, "devices=2"), two).strategy == "fsdp"
    assert switchboard.resolve(compose(*fsdp, "devices=auto"), two).strategy == "fsdp"  # both GPUs
    assert switchboard.resolve(compose("strategy=fsdp", "devices=1"), two).strategy == "fsdp"  # contiguous weights
    one = fake_gpu("NVIDIA H100 80GB HBM3", (9, 0), count=1)
    with pytest.raises(ConfigError, match="shard group of one GPU"):
        switchboard.resolve(compose(*fsdp, "devices=auto"), one)  # on a one-GPU machine


def test_fsdp_without_gpu_names_fsdp2(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="fsdp2"):
        train(*PROBE, "strategy=fsdp")


@pytest.mark.parametrize(
    "gpu,capability,amp",
    [
        ("NVIDIA H100 80GB HBM3", (9, 0), ["amp=true", "amp_dtype=fp16"]),
        ("Tesla V100-SXM2-16GB", (7, 0), ["amp=true"]),  # auto picks fp16 where bf16 is not native
    ],
)
def test_fsdp2_with_fp16_is_refused_before_anything_is_built(fake_gpu, compose, gpu, capability, amp):
    """Lightning's ModelParallelStrategy takes no 16-mixed: refused by resolve(), which runs before data or model exist."""
    from trainer.errors import ConfigError
    from trainer.switches import switchboard

    hw = fake_gpu(gpu, capability, count=2)
    with pytest.raises(ConfigError, match=r"'strategy=fsdp2' cannot run fp16 autocast .*amp_dtype=bf16"):
        switchboard.resolve(compose("strategy=fsdp2", *amp), hw)
    assert switchboard.resolve(compose("strategy=fsdp2", "amp=true", "amp_dtype=bf16"), hw).precision == "bf16-mixed"
    assert switchboard.resolve(compose("strategy=fsdp", *amp), hw).precision == "16-mixed"  # FSDP1 has a sharded scaler


def _readme_switchboard_flags() -> list:
    """The flags the README's switchboard table promises (the first column of its rows)."""
    import re

    from conftest import ROOT

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The switchboard") : text.index("## Recipes")]
    return re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M)


def test_every_readme_flag_is_recorded_as_it_was_set(train):
    flags = _readme_switchboard_flags()
    assert len(flags) >= 12 and "amp" in flags and "cudnn_benchmark" in flags
    from trainer.config import FLAG_KEYS

    assert not set(flags) - set(FLAG_KEYS), set(flags) - set(FLAG_KEYS)
    # non-default values, so a recorder that wrote defaults (or nothing) fails
    given = {
        "channels_last": True,
        "accumulate": 2,
        "tf32": True,
        "cudnn_benchmark": True,
        "compile_mode": "reduce-overhead",
        "optim.zero_grad_to_none": False,
        "lr_scaling": "sqrt",
        "optim.fused": "foreach",
    }
    metrics, _ = train(*PROBE, *[f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in given.items()])
    assert not set(flags) - set(metrics["flags"])
    assert {k: metrics["flags"][k] for k in given} == given


def _ema_of(history, decay):
    """The exponential moving average of a run's weights after each optimizer step, computed here in
    float64: the first step's weights, then ``decay * average + (1 - decay) * weights`` per step (integer
    buffers, BatchNorm's step count, follow the weights)."""
    average = {k: v.double() if v.is_floating_point() else v for k, v in history[0].items()}
    for state in history[1:]:
        for k, v in state.items():
            average[k] = decay * average[k] + (1 - decay) * v.double() if v.is_floating_point() else v
    return average


def _assert_same_state(actual, expected, what):
    assert set(actual) == set(expected) and expected, what
    for name, value in expected.items():
        assert torch.allclose(actual[name].double(), value.double(), rtol=1e-5, atol=1e-6), (what, name)


def test_ema_validates_and_saves_the_averaged_weights_not_the_raw_ones(train, add_callbacks):
    """ema=true: the weights a validation sees are the exponential moving average, at ema_decay, of the
    weights every optimizer step so far left, and they are what the checkpoint saves as its state_dict
    (the raw weights beside them); metrics.json says so."""
    import pytorch_lightning as pl

    history, validated = [], {}

    class Spy(pl.Callback):  # runs after the EMA callback's update and swap (added last)
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            history.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking and batch_idx == 0:
                validated[trainer.global_step] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    add_callbacks(Spy())
    m, out = train("ema=true", "ema_decay=0.9", "trainer.max_epochs=2", "checkpoint.enabled=true")
    assert m["flags"]["ema"] is True and m["validated_weights"] == "ema"
    assert len(history) == 16 and sorted(validated) == [8, 16]  # 8 optimizer steps per epoch
    for step, state in validated.items():
        _assert_same_state(state, _ema_of(history[:step], 0.9), f"validation after step {step}")
        assert not all(torch.equal(state[k], history[step - 1][k]) for k in state)  # not what training left
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["weights"] == "ema" and ckpt["global_step"] == 16
    _assert_same_state(ckpt["state_dict"], _ema_of(history, 0.9), "the checkpoint's state_dict")
    for name, value in history[-1].items():
        assert torch.equal(ckpt["current_model_state"][name], value), name  # the raw weights beside it
    # without the flag: validation sees what training left
    history.clear()
    validated.clear()
    m, _ = train("trainer.max_epochs=1")
    assert m["validated_weights"] == "raw" and sorted(validated) == [8]
    for name, value in validated[8].items():
        assert torch.equal(value, history[-1][name]), name


def test_sigterm_during_validation_of_an_ema_run_waits_for_a_training_step_and_resumes_the_training_weights(
    train, add_callbacks, compose
):
    """Validation holds the averaged weights in the model: a stop there must not save them as the
    training weights. SIGTERM (like SIGUSR1 and Ctrl-C) waits for the next training step's end,
    where the model holds what training left, and a resume continues from exactly those weights."""
    import os
    import signal

    import pytorch_lightning as pl

    from trainer.launch import stopping
    from trainer.run import run

    seen = {}

    class Spy(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen["trained"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            seen["step"] = trainer.global_step

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking and "signalled" not in seen:
                seen["signalled"] = trainer.global_step
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_start(self, trainer, pl_module):
            seen["resumed"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    add_callbacks(Spy(), first=True)  # before the stop's own batch-end hook, which raises
    args = ["ema=true", "ema_decay=0.9", "trainer.max_epochs=3", "checkpoint.enabled=true", "data.val_samples=32"]
    try:
        m, out = train(*args)
    finally:
        stopping.clear()  # the request is process-wide (a sweep's jobs share it): this test's ends here
    assert m["status"] == "failed" and "preempted by SIGTERM at step" in m["error"], m["error"]
    assert seen["signalled"] == 8 and seen["step"] == 9, seen  # signalled in epoch 0's validation, stopped after step 9
    stopped = seen["trained"]
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 9 and ckpt["weights"] == "ema"
    for name, value in stopped.items():
        assert torch.equal(ckpt["current_model_state"][name], value), name  # the raw weights, as trained
    resumed_args = [*TINY, *args, "ckpt_path=last"]
    m = run(compose(*resumed_args), str(out), resumed_args)
    assert m["status"] == "ok", m["error"]
    assert set(seen["resumed"]) == set(stopped)
    for name, value in stopped.items():
        assert torch.equal(seen["resumed"][name], value), name  # training continues from the training weights


def test_ema_stopped_mid_run_and_resumed_ends_with_the_average_of_a_run_never_stopped(train, add_callbacks, compose):
    """A resume restores the average and its update count: the first update after it blends the new
    weights into the restored average at ema_decay, as the run that was never stopped did, rather than
    starting the average over from that step's weights."""
    import os
    import signal

    import pytorch_lightning as pl

    from trainer.callbacks.ema import EMA
    from trainer.launch import stopping
    from trainer.run import run

    seen = {}

    class Stop(pl.Callback):  # before the stop's own batch-end hook, which raises
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if seen.get("stop") and trainer.global_step == 11 and "signalled" not in seen:
                seen["signalled"] = trainer.global_step
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_start(self, trainer, pl_module):
            (ema,) = [c for c in trainer.callbacks if isinstance(c, EMA)]
            seen.setdefault("updates at start", []).append(ema.updates)

    add_callbacks(Stop(), first=True)
    args = ["ema=true", "ema_decay=0.9", "trainer.max_epochs=2", "checkpoint.enabled=true"]
    m, straight = train(*args)
    assert m["status"] == "ok"
    seen["stop"] = True
    try:
        m, out = train(*args)
    finally:
        stopping.clear()  # the request is process-wide: this test's ends here
    assert m["status"] == "failed" and "preempted by SIGTERM" in m["error"], m["error"]
    stopped = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert 11 <= stopped["global_step"] < 16  # mid-way through the second epoch
    resumed_args = [*TINY, *args, "ckpt_path=last"]
    m = run(compose(*resumed_args), str(out), resumed_args)
    assert m["status"] == "ok", m["error"]
    assert seen["updates at start"] == [0, 0, stopped["global_step"]]  # one update per step before the stop
    never, resumed = (
        torch.load(d / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False) for d in (straight, out)
    )
    assert never["global_step"] == resumed["global_step"] == 16
    for key in ("current_model_state", "state_dict"):  # the raw weights, then their average
        _assert_same_state(resumed[key], never[key], key)


def test_a_checkpoint_saved_with_ema_resumed_without_it_trains_on_from_the_raw_weights(
    add_callbacks, compose, tmp_path
):
    """Its state_dict is the average: loaded as the model, training went on from the average with the raw
    weights' optimizer state, saying nothing. Without EMA the run continues from the raw weights."""
    import pytorch_lightning as pl
    from conftest import TINY

    from trainer.run import run

    started = {}

    class Spy(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            started["state"] = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    add_callbacks(Spy())
    out = tmp_path / "run"
    run(compose(*TINY, "ema=true", "ema_decay=0.9", "checkpoint.enabled=true"), str(out))
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    run(compose(*TINY, "checkpoint.enabled=true", "ckpt_path=last", "trainer.max_epochs=2"), str(out))
    weights = [k for k in ckpt["current_model_state"] if "running" not in k and "num_batches" not in k]
    assert any(not torch.equal(ckpt["state_dict"][k], ckpt["current_model_state"][k]) for k in weights)
    for name in weights:
        assert torch.equal(started["state"][name], ckpt["current_model_state"][name]), name


def test_ema_with_weights_only_checkpoints_is_refused_up_front(compose):
    """Lightning skips callbacks on weights-only saves, so such a file would hold the raw weights while
    metrics.json says validation used the average."""
    from trainer.errors import ConfigError
    from trainer.measure import hardware
    from trainer.switches import switchboard

    with pytest.raises(ConfigError, match=r"'ema=true' with 'checkpoint.save_weights_only=true'"):
        switchboard.resolve(compose("ema=true", "checkpoint.save_weights_only=true"), hardware.detect("cpu"))
    switchboard.resolve(compose("ema=true"), hardware.detect("cpu"))


def test_ema_with_a_sharded_strategy_is_refused_up_front(train, monkeypatch):
    """Lightning's weight averaging keeps a whole unsharded copy of the model: say so before anything is built."""
    from trainer.data import ImageDataModule
    from trainer.errors import ConfigError

    built, real = [], ImageDataModule.build
    monkeypatch.setattr(ImageDataModule, "build", lambda self: built.append(1) or real(self))
    with pytest.raises(ConfigError, match="'ema=true' keeps an unsharded copy of the whole model"):
        train(*PROBE, "strategy=fsdp2", "devices=1", "ema=true")
    assert not built


def test_stop_at_acc_stops_at_the_first_epoch_that_reaches_it_and_needs_validation(train):
    """stop_at_acc (what the tuner's time-to-target probes use): training ends after the first
    validated epoch whose val_acc reaches it, that epoch is recorded; without validation it is refused."""
    from trainer.errors import ConfigError

    m, _ = train("trainer.max_epochs=5", "stop_at_acc=0.5")
    accs = [e["val_acc"] for e in m["epochs"]]
    assert m["status"] == "ok" and len(accs) < 5 and accs[-1] >= 0.5 and all(a < 0.5 for a in accs[:-1]), accs
    assert m["stopped_at_acc_epoch"] == len(accs) - 1
    with pytest.raises(ConfigError, match="'stop_at_acc=0.5' stops when a validated epoch reaches"):
        train("stop_at_acc=0.5", "trainer.limit_val_batches=0")


def test_stop_at_acc_stops_at_an_epoch_that_meets_it_exactly(train):
    """An epoch whose val_acc equals stop_at_acc reaches it, as the report and the tuner count it
    (accuracies are k/N and targets round numbers): training stops there, not epochs later."""
    full, _ = train("trainer.max_epochs=6")
    accs = [e["val_acc"] for e in full["epochs"]]
    # the last epoch before the final one that sets a new best: stopping there is visible
    records = [i for i in range(1, len(accs) - 1) if accs[i] > max(accs[:i])]
    assert records, accs
    k = records[-1]
    m, _ = train("trainer.max_epochs=6", f"stop_at_acc={accs[k]}")
    assert [e["val_acc"] for e in m["epochs"]] == accs[: k + 1], (accs, k)
    assert m["stopped_at_acc_epoch"] == k


def test_progressive_resize_trains_each_epoch_at_its_size_and_validates_at_full_size(train, add_callbacks):
    import pytorch_lightning as pl

    seen = []

    class Spy(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            def record(module, args):
                if not trainer.sanity_checking:
                    seen.append((trainer.current_epoch, trainer.training, args[0].shape[-1]))

            pl_module.register_forward_pre_hook(record)

    add_callbacks(Spy())
    m, _ = train(
        "progressive_resize=true", "data.image_size=32", "trainer.max_epochs=5", "progressive.start_size=16",
        "progressive.start_epoch=1", "progressive.end_epoch=4", "channels_last=true",
    )  # fmt: skip
    # 16 px to epoch 1, then growing over 3 epochs in steps of 8 px (16 + 16/3 rounds down to 16, 16 + 32/3 to 24),
    # full size from epoch 4; validation always at 32. (Without the keys: [16, 16, 24, 32, 32]; start_epoch
    # ignored: [16, 16, 24, 24, 32])
    trained = sorted({(epoch, size) for epoch, training, size in seen if training})
    assert trained == [(0, 16), (1, 16), (2, 16), (3, 24), (4, 32)], trained
    assert {size for _, training, size in seen if not training} == {32}
    assert [e["image_size"] for e in m["epochs"]] == [16, 16, 16, 24, 32]
    assert m["epochs"][0]["tflops"] < m["epochs"][-1]["tflops"] * 0.5  # a 16 px step is a quarter of a 32 px one's math
    seen.clear()
    m, _ = train("data.image_size=32", "trainer.max_epochs=2")
    assert {size for _, _, size in seen} == {32} and "image_size" not in m["epochs"][0]


def test_progressive_schedule_keys_shape_the_sizes_per_epoch():
    """progressive.start_epoch holds start_size through that epoch, progressive.end_epoch is the first at
    full size, growth is linear between them, rounded down to progressive.bucket; by default growth
    starts at once and full size is reached at epoch ceil(0.8 * max_epochs) - 1."""
    from trainer.data.progressive import schedule

    assert schedule(32, 10, 16, bucket=4) == [16, 16, 20, 20, 24, 24, 28, 32, 32, 32]  # full from ceil(8) - 1 = 7
    assert schedule(32, 8, 16, start_epoch=2, end_epoch=6, bucket=4) == [16, 16, 16, 20, 24, 28, 32, 32]
    assert schedule(32, 8, 16, end_epoch=2, bucket=4) == [16, 24, 32, 32, 32, 32, 32, 32]
    assert schedule(32, 8, 16, start_epoch=5, bucket=4) == [16, 16, 16, 16, 16, 16, 32, 32]  # end: ceil(6.4) - 1 = 6
    assert schedule(32, 8, 16, start_epoch=3, end_epoch=3, bucket=4) == [16, 16, 16, 32, 32, 32, 32, 32]
    assert schedule(32, 4, 16, start_epoch=1, end_epoch=9, bucket=4) == [16, 16, 16, 20]  # full size past the run
    assert schedule(32, 6, None, start_epoch=1, end_epoch=3) == [16, 16, 24, 32, 32, 32]  # start: half of 32


def test_progressive_resize_is_refused_for_a_model_that_cannot_take_its_start_size(train):
    from trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="trains at 16 px first, and this model cannot take 16 px images"):
        train("model=vit", "model.patch_size=8", "model.num_layers=1", "model.num_heads=2", "model.hidden_dim=16",
              "model.mlp_dim=32", "data.image_size=32", "progressive_resize=true", "progressive.start_size=16",
              "trainer.max_epochs=2")  # fmt: skip


def test_an_emulated_cpu_capability_gets_an_inductor_cache_of_its_own(monkeypatch, tmp_path):
    """Inductor's cache does not key its CPU kernels on ATEN_CPU_CAPABILITY (a kernel made under one
    and loaded under the other computed wrong values and corrupted the heap): with the capability set,
    importing the trainer names a cache dir of that capability's own, before Lightning's import writes
    Inductor's default into the environment (also over that default); a user's dir is kept."""
    import getpass
    import os
    import subprocess
    import sys
    import tempfile

    import trainer

    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    for before, capability, after in (
        (None, "avx2", f"{default}_avx2"),
        (default, "avx2", f"{default}_avx2"),  # Inductor's own default, as an import wrote it
        (str(tmp_path / "mine"), "avx2", str(tmp_path / "mine")),
        (None, None, None),
    ):
        for key, value in (("TORCHINDUCTOR_CACHE_DIR", before), ("ATEN_CPU_CAPABILITY", capability)):
            monkeypatch.delenv(key, raising=False) if value is None else monkeypatch.setenv(key, value)
        trainer._inductor_cache_per_cpu_capability()
        assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") == after, (before, capability)
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    code = "import os, trainer, pytorch_lightning; print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**env, "ATEN_CPU_CAPABILITY": "avx2"}, capture_output=True, text=True
    )
    assert out.stdout.strip() == f"{default}_avx2", out.stderr[-2000:]


def test_a_job_builds_its_model_and_checks_and_resolves_its_switches_once(train, monkeypatch, caplog):
    """In-process: the model built once (the FLOPs are counted on a meta copy of it, not on a second
    model built from the config), the config checked and the switches resolved once. In a process a
    launcher started (its ranks, an allocator's child): checked and resolved not at all, it takes the
    plan its launcher resolved (handed over in the environment), warnings included."""
    import logging

    from trainer import config as config_mod
    from trainer.models import tiny
    from trainer.switches import switchboard

    built, resolved, validated = [], [], []
    real_init, real_resolve, real_validate = tiny.TinyCNN.__init__, switchboard.resolve, config_mod.validate

    def counted_init(self, *args, **kwargs):
        built.append(type(self))
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(tiny.TinyCNN, "__init__", counted_init)
    monkeypatch.setattr(switchboard, "resolve", lambda *a: resolved.append(1) or real_resolve(*a))
    monkeypatch.setattr(config_mod, "validate", lambda *a: validated.append(1) or real_validate(*a))
    m, _ = train()
    assert m["status"] == "ok" and m["flops_per_sample"] > 0
    assert (len(built), len(resolved), len(validated)) == (1, 1, 1)
    plan = switchboard.Plan("cpu", 1, 1, "32-true", None, "auto", ["handed over by the launcher"])
    monkeypatch.setenv(switchboard.PLAN_ENV, switchboard.plan_env(plan)[switchboard.PLAN_ENV])
    with caplog.at_level(logging.WARNING):
        m, _ = train()
    assert m["status"] == "ok" and (len(resolved), len(validated)) == (1, 1)  # nothing more
    assert "handed over by the launcher" in caplog.text
