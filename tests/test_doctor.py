"""Where the time goes: the bottleneck doctor on planted bottlenecks, the system monitor, and
profiler traces served by a real TensorBoard."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from trainer import doctor

CPU = {"accelerator": "cpu", "cpu_cores": 2, "bf16_native": False, "capability": ""}
H100 = {"accelerator": "cuda", "cpu_cores": 16, "bf16_native": True, "capability": "9.0"}


def test_planted_slow_dataset_is_input_bound(train):
    m, _ = train(
        "data=custom",
        "data.dataset._target_=spies.SlowDataset",
        "+data.dataset.n=64",
        "+data.dataset.sleep_ms=10",
        "data.val_samples=0",
        "trainer.limit_val_batches=0",
    )
    d = m["diagnosis"]
    assert d["bottleneck"] == "input pipeline", d
    assert "data.num_workers=1" in d["try"] and "waiting for the next batch" in d["verdict"]


def test_planted_heavy_compute_is_compute_bound(train):
    m, _ = train("data.batch_size=256", "data.num_samples=1024", "data.image_size=32", "model.width=48")
    d = m["diagnosis"]
    assert d["bottleneck"] == "compute", d
    from trainer.measure.hardware import detect

    native = detect().bf16_native  # AMX/AVX512-BF16 CPUs run bf16 at full speed; AVX2-only ones emulate it
    assert "compile=true" in d["try"]
    assert ("amp=true" in d["try"]) == native  # amp is only suggested where it can pay off
    assert not any("bf16" in n for n in d["hardware"])  # amp is off: nothing to say about bf16 on any CPU


def test_hardware_notes_speak_of_the_flags_that_are_on():
    avx2 = dict(CPU, bf16_native=False)
    assert any(
        "amp=true ran emulated bf16" in n for n in doctor.hardware_notes(avx2, {"amp": True, "amp_dtype": "auto"})
    )
    assert doctor.hardware_notes(avx2, {"amp": False}) == []
    assert doctor.hardware_notes(dict(CPU, bf16_native=True), {"amp": True}) == []
    v100 = {"accelerator": "cuda", "cpu_cores": 8, "bf16_native": False, "capability": "7.0"}
    assert doctor.hardware_notes(v100, {"amp": False, "tf32": False}) == [] and doctor.hardware_notes(
        v100, {"tf32": True}
    )


def test_input_bound_with_a_saturated_cpu_does_not_ask_for_more_workers():
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.6},
        system={"cpu_busy_cores": 15.8, "process_cpu_cores": 15.5},
        hardware=H100,
        flags={},
        data={"num_workers": 15, "pin_memory": True},
        is_convnet=True,
    )
    assert d["bottleneck"] == "input pipeline" and not any(s.startswith("data.num_workers") for s in d["try"])
    assert "saturated" in d["verdict"]
    assert "data.decoder=nvjpeg" not in d["try"]  # synthetic data: nothing to decode
    jpeg = {"name": "builtin", "decoder": "pil", "num_workers": 15, "pin_memory": True}
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.6},
        system={"cpu_busy_cores": 15.8, "process_cpu_cores": 15.5},
        hardware=H100,
        flags={},
        data=jpeg,
        is_convnet=True,
    )
    assert "data.decoder=nvjpeg" in d["try"] and "data=packed" in d["try"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.6},
        system={"cpu_busy_cores": 1.9, "process_cpu_cores": 1.9},
        hardware=CPU,
        flags={},
        data=dict(jpeg, num_workers=1),
        is_convnet=True,
    )
    assert "data.decoder=turbo" in d["try"] and "data.decoder=nvjpeg" not in d["try"]
    for name in ("imagefolder", "imagenette"):  # image files as well: the same decoders apply
        d = doctor.diagnose(
            metrics={"data_wait_fraction": 0.6},
            system={"cpu_busy_cores": 15.8, "process_cpu_cores": 15.5},
            hardware=H100,
            flags={},
            data=dict(jpeg, name=name),
            is_convnet=True,
        )
        assert "data.decoder=nvjpeg" in d["try"], name


def test_input_bound_with_a_heavy_augmentation_names_it_and_the_row_that_measures_it():
    jpeg = {"name": "builtin", "decoder": "pil", "num_workers": 15, "pin_memory": True}
    args = dict(
        metrics={"data_wait_fraction": 0.6},
        system={"cpu_busy_cores": 15.8, "process_cpu_cores": 15.5},
        hardware=H100,
        flags={},
        is_convnet=True,
        facts=doctor.Facts(dali_installed=True),
    )
    plain = doctor.diagnose(data=dict(jpeg, augment_policy="none", random_erasing=0.0), **args)
    assert "plain_augment" not in plain["verdict"] and "augmentation (" not in plain["verdict"]
    heavy = doctor.diagnose(data=dict(jpeg, augment_policy="randaugment", random_erasing=0.25), **args)
    assert heavy["bottleneck"] == "input pipeline"
    assert "augmentation (data.augment_policy=randaugment, data.random_erasing=0.25)" in heavy["verdict"]
    assert "+bench=plain_augment" in heavy["verdict"]
    # the augmentation is not an accuracy-safe flag to drop; DALI is not offered beside random erasing, which it refuses
    assert "data.loader=dali" in plain["try"] and heavy["try"] == [s for s in plain["try"] if s != "data.loader=dali"]


def test_input_bound_on_a_big_machine_names_workers_and_cores():
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.62},
        system={"cpu_busy_cores": 2.0, "process_cpu_cores": 1.9},
        hardware=H100,
        flags={},
        data={"num_workers": 2},
        is_convnet=True,
    )
    assert (
        d["try"][:2] == ["data.num_workers=15", "data.persistent_workers=true"] and "data.pin_memory=true" in d["try"]
    )
    assert "62% of training time waiting" in d["verdict"] and "2.0 of 16 cores busy" in d["verdict"]


def test_the_workers_the_run_used_are_judged_and_no_setting_it_has_is_suggested_again():
    """data.auto_workers=true: the doctor reads the workers the run used (metrics.json's num_workers),
    not the config's 0; it never suggests the count or the persistence the run already has."""
    auto = {"num_workers": 0, "auto_workers": True, "pin_memory": True}
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.5, "num_workers": 15},
        system={"cpu_busy_cores": 6.0, "process_cpu_cores": 5.0},
        hardware=H100,
        flags={},
        data=auto,
        is_convnet=True,
    )
    assert "and 15 loader workers" in d["verdict"] and not any(s.startswith("data.num_workers") for s in d["try"])
    assert "data.persistent_workers=true" in d["try"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.5, "num_workers": 16},
        system={"cpu_busy_cores": 20.0, "process_cpu_cores": 18.0},
        hardware=dict(H100, cpu_cores=64),
        flags={},
        data={"num_workers": 16, "persistent_workers": True, "pin_memory": True},
        is_convnet=True,
    )
    assert d["bottleneck"] == "input pipeline"
    assert not any(s.startswith(("data.num_workers", "data.persistent_workers")) for s in d["try"]), d["try"]
    # on a CPU, the workers auto_workers started are the ones sharing the cores with the step
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.1, "num_workers": 1},
        system={"cpu_busy_cores": 2.0, "process_cpu_cores": 1.95, "main_process_cpu_cores": 1.2},
        hardware=CPU,
        flags={},
        data={"num_workers": 0, "auto_workers": True},
        is_convnet=True,
    )
    assert d["bottleneck"] == "shared cores", d


def test_gpu_transfer_overhead_and_memory_verdicts():
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05},
        system={"gpu/util": 90.0},
        hardware=H100,
        flags={},
        data={},
        is_convnet=True,
        h2d_share=0.3,
    )
    assert d["bottleneck"] == "host-device transfer" and d["try"] == [
        "data.pin_memory=true",
        "data.gpu_normalize=true",
        "data.device_prefetch=true",
    ]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05},
        system={"gpu/util": 35.0},
        hardware=H100,
        flags={},
        data={},
        is_convnet=False,
    )
    assert d["bottleneck"] == "CPU-side overhead" and "compile=true" in d["try"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05, "peak_memory_mb": 76000},
        system={"gpu/util": 97.0},
        hardware=H100,
        flags={},
        data={},
        is_convnet=True,
        device_memory_mb=80000,
    )
    assert d["bottleneck"] == "memory" and "activation_checkpointing=true" in d["try"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05, "peak_memory_mb": 9000},
        system={"gpu/util": 97.0},
        hardware=H100,
        flags={"amp": True},
        data={},
        is_convnet=True,
        device_memory_mb=80000,
    )
    assert (
        d["bottleneck"] == "compute"
        and "data.batch_size=auto" in d["try"]
        and "amp=true" not in d["try"]
        and "tf32=true" not in d["try"]
    )


def test_competing_processes_are_called_out():
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05},
        system={"cpu_busy_cores": 1.9, "process_cpu_cores": 0.9},
        hardware=CPU,
        flags={},
        data={},
        is_convnet=True,
    )
    assert any("other processes kept about 1.0 of 2 cores busy" in n for n in d["hardware"])


def test_hardware_checks(fake_gpu, compose):
    from trainer.switches import switchboard

    v100 = fake_gpu("Tesla V100-SXM2-16GB", (7, 0))  # what detect() itself makes of a V100, not a hand-built one
    assert v100.accelerator == "cuda" and not v100.bf16_native  # emulated bf16 is not native
    plan = switchboard.resolve(compose("amp=true"), v100)
    assert plan.amp_dtype == "fp16" and plan.precision == "16-mixed", plan  # amp_dtype=auto picks fp16 here
    notes = doctor.hardware_notes(v100.as_dict(), {"amp": True})
    assert any("no native bf16: amp uses fp16 with loss scaling" in n for n in notes)
    assert "tf32=true" not in doctor.compute_suggestions({}, v100.as_dict(), True)
    h100 = fake_gpu("NVIDIA H100 80GB HBM3", (9, 0))
    assert h100.bf16_native and switchboard.resolve(compose("amp=true"), h100).amp_dtype == "bf16"
    p100 = {"accelerator": "cuda", "cpu_cores": 8, "bf16_native": False, "capability": "6.0"}
    assert any("Triton" in n for n in doctor.hardware_notes(p100, {"compile": True}))


def test_system_monitor_samples_every_interval_not_every_step(train, monkeypatch):
    """32 steps of about 10 ms per epoch and a 0.1 s interval: a handful of readings per epoch, each
    covering at least the interval (but an epoch's last, which closes its window), not one per step.
    With no validation between, the closing reading of an epoch is the next one's baseline: the
    process tree is not walked again while the GPU waits for the next epoch's first step."""
    from trainer.callbacks import SystemMonitor

    readings, baselines = [], []
    real, real_baseline = SystemMonitor.sample, SystemMonitor._baseline
    monkeypatch.setattr(
        SystemMonitor, "sample", lambda self, trainer=None: readings.append(real(self, trainer)) or readings[-1]
    )
    monkeypatch.setattr(SystemMonitor, "_baseline", lambda self: baselines.append(1) or real_baseline(self))
    m, out = train(
        "monitor.interval_s=0.1",
        "data=custom",
        "data.dataset._target_=spies.SlowDataset",
        "+data.dataset.n=256",
        "+data.dataset.sleep_ms=1.2",
        "data.val_samples=0",
        "trainer.limit_val_batches=0",
        "trainer.max_epochs=2",
    )
    steps, train_s = sum(e["steps"] for e in m["epochs"]), sum(e["time_s"] for e in m["epochs"])
    assert steps == 64 and readings, (steps, len(readings))
    assert len(readings) <= train_s / 0.1 + 2, (len(readings), train_s)  # one per interval, and one closing each epoch
    if train_s / steps < 0.05:  # steps well under the interval: far fewer readings than steps
        assert len(readings) < steps / 2, (len(readings), steps)
    for epoch in (0, 1):
        windows = [r["window_s"] for r in readings if r["epoch"] == epoch]
        assert windows and all(w >= 0.1 for w in windows[:-1]), windows
    assert len(baselines) == 2, baselines  # when built, and at the first epoch's start only
    evidence = m["diagnosis"]["evidence"]
    assert evidence["cpu_busy_cores"] is not None and 0 <= evidence["cpu_busy_cores"] <= 2.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


@pytest.mark.slow
def test_tensorboard_serves_the_profile_and_the_scalars(train):
    m, out = train("profile=true", "data.num_samples=96", "monitor.interval_s=0.01", "trainer.max_epochs=2")
    assert list((out / "profiler").glob("rank0*.pt.trace.json"))
    port = _free_port()
    tb = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(out),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, runs, tags = (
            time.time() + 180,
            [],
            {},
        )  # returns as soon as both answer; slow only on a loaded machine
        while time.time() < deadline:
            try:
                runs = _get(f"http://127.0.0.1:{port}/data/plugin/pytorch_profiler/runs")
                tags = _get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags")
                if (runs.get("runs") if isinstance(runs, dict) else runs) and tags:
                    break
            except Exception:
                pass
            time.sleep(1)
        run_names = runs.get("runs") if isinstance(runs, dict) else runs
        assert run_names and any("profiler" in r for r in run_names), runs
        all_tags = {t for run in tags.values() for t in run}
        missing = {"perf/epoch_time_s", "perf/samples_per_s", "system/cpu_busy_cores", "system/rss_mb"} - all_tags
        assert not missing, all_tags
    finally:
        tb.terminate()
        tb.wait(timeout=30)


def test_a_gpu_decode_that_takes_the_time_is_named_as_such():
    """With data.decoder=nvjpeg the batches cross the bus encoded and pinned: the transfer share is the
    decode and the per-image transforms on the device, and the bus advice would not help."""
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.21, "transfer_fraction": 0.60},
        system={"gpu/util": 90.0},
        hardware=H100,
        flags={},
        data={"decoder": "nvjpeg", "pin_memory": True, "gpu_normalize": True, "device_prefetch": True},
        is_convnet=True,
        facts=doctor.Facts(dali_installed=True),
    )
    assert d["bottleneck"] == "host-device transfer" and d["try"] == ["data.loader=dali"]
    assert "decoding the JPEGs on the GPU (nvJPEG)" in d["verdict"] and "60% of training time" in d["verdict"]
    assert "the bus is the limit" not in d["verdict"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.21, "transfer_fraction": 0.60},
        system={"gpu/util": 90.0},
        hardware=H100,
        flags={},
        data={"decoder": "nvjpeg", "pin_memory": True, "gpu_normalize": True},
        is_convnet=True,
        facts=doctor.Facts(dali_installed=True),
    )
    assert d["try"] == ["data.device_prefetch=true", "data.loader=dali"]  # the decode overlapped with the step first


def test_transfer_fraction_alone_gives_a_transfer_verdict():
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.02, "transfer_fraction": 0.35},
        system={"gpu/util": 90.0},
        hardware=H100,
        flags={},
        data={"pin_memory": False},
        is_convnet=True,
    )
    assert d["bottleneck"] == "host-device transfer" and d["try"] == [
        "data.pin_memory=true",
        "data.gpu_normalize=true",
        "data.device_prefetch=true",
    ]
    assert "35% of training time" in d["verdict"] and d["evidence"]["transfer_fraction"] == 0.35
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.02, "transfer_fraction": 0.35},
        system={},
        hardware=CPU,
        flags={},
        data={"gpu_normalize": True},
        is_convnet=True,
    )
    assert d["bottleneck"] == "host-device transfer" and d["try"] == ["data.gpu_normalize=false"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.02, "transfer_fraction": 0.05},
        system={},
        hardware=CPU,
        flags={},
        data={},
        is_convnet=True,
    )
    assert d["bottleneck"] == "compute"


def test_memory_full_is_judged_on_the_allocators_reservation():
    """76 of 80 GB reserved while only 40 GB allocated: the device is full (fragmentation and cached
    blocks count); judged on allocated memory it read as half empty."""
    m = {"data_wait_fraction": 0.05, "peak_memory_mb": 40000, "peak_memory_reserved_mb": 76000}
    d = doctor.diagnose(
        metrics=m, system={"gpu/util": 97.0}, hardware=H100, flags={}, data={}, is_convnet=True, device_memory_mb=80000
    )
    assert d["bottleneck"] == "memory" and d["evidence"]["memory_used_fraction"] == 0.95


def test_no_competition_verdict_under_a_cgroup_quota():
    busy = {"cpu_busy_cores": 1.9, "process_cpu_cores": 0.9}
    assert any(
        "other processes" in n
        for n in doctor.diagnose(metrics={}, system=busy, hardware=CPU, flags={}, data={}, is_convnet=True)["hardware"]
    )
    quota = dict(CPU, cpu_quota=1.5, cpu_cores=1)
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.05}, system=busy, hardware=quota, flags={}, data={}, is_convnet=True
    )
    assert not any("other processes" in n for n in d["hardware"])
    assert "this run using 0.9 of its 1.5-core quota" in d["verdict"] and "1.9 of" not in d["verdict"]


def test_input_bound_on_an_object_store_read_directly_says_cache_it_first():
    remote = {"name": "parquet", "root": "s3://bucket/ds", "decoder": "pil", "num_workers": 1, "cache": None}
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.8},
        system={"cpu_busy_cores": 0.6, "process_cpu_cores": 0.5},
        hardware=CPU,
        flags={},
        data=remote,
        is_convnet=True,
        facts=doctor.Facts(data_remote=True),
    )
    assert d["bottleneck"] == "input pipeline" and d["try"][0] == "data.cache=DIR" and "object store" in d["verdict"], d
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.8},
        system={"cpu_busy_cores": 0.6, "process_cpu_cores": 0.5},
        hardware=H100,
        flags={},
        data=remote,
        is_convnet=True,
        facts=doctor.Facts(data_remote=True),
    )
    assert (
        "data.decoder=nvjpeg" not in d["try"] and "data.decoder=turbo" in d["try"]
    )  # shard bytes are not decoded on the GPU
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.8},
        system={"cpu_busy_cores": 0.6, "process_cpu_cores": 0.5},
        hardware=CPU,
        flags={},
        data=dict(remote, cache="/nvme/cache"),
        is_convnet=True,
        facts=doctor.Facts(data_remote=True),
    )
    assert "data.cache=DIR" not in d["try"] and "object store" not in d["verdict"]
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.8},
        system={"cpu_busy_cores": 0.6, "process_cpu_cores": 0.5},
        hardware=CPU,
        flags={},
        data=dict(remote, root="/local/ds"),
        is_convnet=True,
    )
    assert "data.cache=DIR" not in d["try"]


def test_copy_share_counts_each_device_interval_once():
    """A CUDA profile as torch's Kineto profiler reports it: each kernel appears as a device event
    and again inside the CPU op that launched it, and ``ProfilerStep#N`` spans the whole step on
    the device. 100 us of copies in 400 us of device work is a quarter, not a fourteenth."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    from trainer.callbacks.profiler import h2d_share

    def event(n, name, start, end, device=DeviceType.CPU, annotation=False):
        thread = 0 if device == DeviceType.CPU else 7
        return FunctionEvent(
            n, name, thread, start, end, stack=[], use_device="cuda", device_type=device, is_user_annotation=annotation
        )

    copy, conv = event(2, "aten::copy_", 10, 20), event(3, "aten::convolution", 30, 40)
    copy.append_kernel("Memcpy HtoD (Pageable -> Device)", 0, 100)
    conv.append_kernel("sm90_xmma_fprop_implicit_gemm", 0, 300)
    events = EventList(
        [
            event(1, "ProfilerStep#3", 0, 1000),
            copy,
            conv,
            event(4, "Memcpy HtoD (Pageable -> Device)", 100, 200, DeviceType.CUDA),
            event(5, "sm90_xmma_fprop_implicit_gemm", 200, 500, DeviceType.CUDA),
            event(6, "ProfilerStep#3", 0, 600, DeviceType.CUDA, annotation=True),
        ],
        use_device="cuda",
    )
    events._build_tree()
    averages = events.key_averages()
    assert {e.key for e in averages} >= {"aten::copy_", "Memcpy HtoD (Pageable -> Device)", "ProfilerStep#3"}
    assert h2d_share(averages) == 0.25


def test_loader_workers_sharing_the_cores_with_the_step_is_named_with_both_shares():
    """A CPU run whose loader workers and training step fill the cores together: the verdict says how
    much each took and asks for the measurement that decides (with and without workers), not only
    'compute'. The same run without the workers' share, on a GPU, or under a launcher (no split) is not."""
    jpeg = {"name": "imagefolder", "decoder": "pil", "num_workers": 1}
    system = {"cpu_busy_cores": 2.0, "process_cpu_cores": 1.95, "main_process_cpu_cores": 1.55}
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.03}, system=system, hardware=CPU, flags={}, data=jpeg, is_convnet=True
    )
    assert d["bottleneck"] == "shared cores", d
    assert "the workers used 0.4 and the step 1.6" in d["verdict"] and "-m data.num_workers=0,1" in d["verdict"]
    assert d["try"][0] == "data.num_workers=0" and "data.decoder=turbo" in d["try"]
    assert d["evidence"]["main_process_cpu_cores"] == 1.55
    for other in (
        dict(system, main_process_cpu_cores=1.9),  # the workers hardly work
        {k: v for k, v in system.items() if k != "main_process_cpu_cores"},  # under a launcher: no split
        dict(system, process_cpu_cores=1.2, main_process_cpu_cores=0.8),  # cores to spare
    ):
        d = doctor.diagnose(
            metrics={"data_wait_fraction": 0.03}, system=other, hardware=CPU, flags={}, data=jpeg, is_convnet=True
        )
        assert d["bottleneck"] == "compute", (other, d)
    d = doctor.diagnose(
        metrics={"data_wait_fraction": 0.03}, system=system, hardware=CPU, flags={}, data=dict(jpeg, num_workers=0),
        is_convnet=True,
    )  # fmt: skip
    assert d["bottleneck"] == "compute"


def test_the_monitor_splits_the_training_process_from_its_loader_workers(train, small_images):
    """main_process_cpu_cores is the training process alone: with a worker that decodes, less than the
    whole tree's process_cpu_cores; without workers, the same (nothing else in the tree)."""
    common = [
        "data=imagefolder",
        f"data.root={small_images}",
        "data.image_size=16",
        "data.batch_size=8",
        "trainer.max_epochs=2",
        "monitor.interval_s=0.05",
        "trainer.limit_val_batches=0",
    ]
    with_worker, _ = train(*common, "data.num_workers=1", "data.persistent_workers=true")
    alone, _ = train(*common, "data.num_workers=0")
    sw, sa = with_worker["diagnosis"]["evidence"], alone["diagnosis"]["evidence"]
    assert 0 < sw["main_process_cpu_cores"] < sw["process_cpu_cores"], sw
    assert sa["main_process_cpu_cores"] == pytest.approx(sa["process_cpu_cores"], abs=0.05), sa


def test_input_bound_under_dali_speaks_of_its_threads_and_a_torch_run_on_files_is_offered_dali():
    """data.loader=dali: DALI's threads, not loader workers, no pinned memory or persistent workers to
    ask for, and on the GPU nothing about decoders (it decodes with nvJPEG already); a torch-loader run
    on image files is offered data.loader=dali where DALI is installed."""
    args = dict(
        metrics={"data_wait_fraction": 0.5},
        system={"cpu_busy_cores": 4.0, "process_cpu_cores": 3.8},
        hardware=H100,
        flags={},
        is_convnet=True,
        facts=doctor.Facts(dali_installed=True),
    )
    dali = doctor.diagnose(data={"name": "builtin", "loader": "dali", "num_workers": 4}, **args)
    assert dali["bottleneck"] == "input pipeline" and "4 DALI threads" in dali["verdict"], dali["verdict"]
    assert dali["try"] == ["data.num_workers=15"], dali["try"]
    torch_run = doctor.diagnose(data={"name": "builtin", "loader": "torch", "num_workers": 4}, **args)
    assert "4 loader workers" in torch_run["verdict"] and "data.loader=dali" in torch_run["try"], torch_run["try"]
    packed = doctor.diagnose(data={"name": "packed", "num_workers": 4}, **args)
    assert "data.loader=dali" not in packed["try"]
    cpu = dict(
        args, hardware={"accelerator": "cpu", "cpu_cores": 2}, system={"cpu_busy_cores": 2.0, "process_cpu_cores": 1.9}
    )
    on_cpu = doctor.diagnose(data={"name": "builtin", "loader": "dali", "num_workers": 1}, **cpu)
    assert any("DALI's decoding threads run inside the training process" in n for n in on_cpu["hardware"]), on_cpu


def test_under_torchrun_the_worker_suggestion_is_each_ranks_share_of_the_cores():
    """8 ranks on 16 cores: data.auto_workers gives each 16 // 8 - 1 = 1 worker; the doctor suggested 15
    each (120 workers on 16 cores). Where workers would not fit beside the ranks, it says the ranks' count."""
    args = dict(system={"cpu_busy_cores": 9.0, "process_cpu_cores": 8.5}, hardware=H100, flags={}, is_convnet=True)
    one = doctor.diagnose(metrics={"data_wait_fraction": 0.5}, data={"num_workers": 0}, **args)
    eight = doctor.diagnose(
        metrics={"data_wait_fraction": 0.5}, data={"num_workers": 0}, processes_per_node=8, world_size=8, **args
    )
    assert "data.num_workers=15" in one["try"]
    assert "data.num_workers=1" in eight["try"] and "data.num_workers=15" not in eight["try"]
    # data.auto_workers sets its own count over data.num_workers: a count to try would change nothing
    auto = doctor.diagnose(metrics={"data_wait_fraction": 0.5}, data={"num_workers": 0, "auto_workers": True}, **args)
    assert not any(s.startswith("data.num_workers") for s in auto["try"])
    assert "0 loader workers per process (8 on this node)" in eight["verdict"]
    assert any("rank 0's own" in n for n in eight["hardware"]) and not any("rank 0" in n for n in one["hardware"])


def test_a_run_with_no_whole_epoch_timed_gets_no_verdict_rather_than_compute():
    """Every epoch partial (resumed inside its only epoch) or none ran: no data wait was measured, and
    reading it as 0% gave a confident "compute: only 0% of training time waits for data"."""
    d = doctor.diagnose(
        metrics={"data_wait_fraction": None, "transfer_fraction": None},
        system={"cpu_busy_cores": 1.0, "process_cpu_cores": 1.0},
        hardware=CPU,
        flags={},
        data={},
        is_convnet=True,
    )
    assert d["bottleneck"] == "unknown" and d["try"] == [] and "no whole training epoch was timed" in d["verdict"]
    assert d["evidence"]["data_wait_fraction"] is None


def test_the_cpu_overhead_verdict_suggests_only_what_this_gpu_and_config_can_take():
    """compile below sm70 (Triton needs it), reduce-overhead beside a backend other than inductor (the
    config checks refuse it), and data.batch_size=auto where the run has it: none is suggested."""
    args = dict(metrics={"data_wait_fraction": 0.02}, system={"gpu/util": 30.0}, data={}, is_convnet=True)
    p100 = {"accelerator": "cuda", "cpu_cores": 8, "bf16_native": False, "capability": "6.0"}
    d = doctor.diagnose(hardware=p100, flags={}, **args)
    assert d["bottleneck"] == "CPU-side overhead" and d["try"] == ["data.batch_size=auto"]
    d = doctor.diagnose(hardware=H100, flags={"compile": True, "compile_backend": "aot_eager"}, **args)
    assert d["try"] == ["data.batch_size=auto"]
    d = doctor.diagnose(hardware=H100, flags={"data.batch_size": "auto"}, **args)
    assert d["try"] == ["compile=true", "compile_mode=reduce-overhead"]
    d = doctor.diagnose(hardware=H100, flags={"compile": True, "compile_mode": "max-autotune"}, **args)
    assert d["try"] == ["data.batch_size=auto"]  # max-autotune captures CUDA graphs already


def test_the_transfer_verdict_suggests_no_loader_setting_to_a_dali_run_and_dali_only_where_installed():
    args = dict(
        metrics={"data_wait_fraction": 0.05, "transfer_fraction": 0.4},
        system={"gpu/util": 90.0},
        hardware=H100,
        flags={},
        is_convnet=True,
    )
    d = doctor.diagnose(data={"loader": "dali", "name": "imagefolder"}, **args)
    assert d["bottleneck"] == "host-device transfer" and d["try"] == ["data.gpu_normalize=true"]
    nvjpeg = {"name": "imagefolder", "decoder": "nvjpeg", "loader": "torch", "device_prefetch": True}
    installed = doctor.Facts(dali_installed=True)
    assert doctor.diagnose(data=nvjpeg, facts=installed, **args)["try"] == ["data.loader=dali"]
    assert (
        doctor.diagnose(data=dict(nvjpeg, random_erasing=0.25), facts=installed, **args)["try"] == []
    )  # DALI refuses it
    assert doctor.diagnose(data=nvjpeg, **args)["try"] == []  # not installed


def test_bf16_asked_for_on_a_gpu_without_it_is_said_to_run_emulated():
    v100 = {"accelerator": "cuda", "cpu_cores": 8, "bf16_native": False, "capability": "7.0"}
    (auto,) = doctor.hardware_notes(v100, {"amp": True, "amp_dtype": "auto"})
    (bf16,) = doctor.hardware_notes(v100, {"amp": True, "amp_dtype": "bf16"})
    assert "fp16 with loss scaling" in auto and "emulated" not in auto
    assert "amp_dtype=bf16 ran emulated" in bf16 and "amp_dtype=auto picks fp16" in bf16
    (fsdp2,) = doctor.hardware_notes(v100, {"amp": True, "amp_dtype": "bf16", "strategy": "fsdp2"})
    assert "amp_dtype=auto" not in fsdp2  # fsdp2 refuses fp16
    assert doctor.hardware_notes(v100, {"amp": True, "amp_dtype": "fp16"}) == []  # what was asked for, nothing to add


def test_an_input_bound_gpu_run_is_told_which_loader_would_feed_it_from_measured_rates():
    """1,500 images/s at 60% data wait: the model would train 3,750. The 15 PIL workers delivered about
    103 images/s per core they used (14.5), so they would need 36 cores of the 15 this node leaves
    them; turbo and DALI, at this machine's measured per-core rates against PIL's, would not do
    either; nvJPEG decodes on the GPU and comes first."""
    jpeg = {"name": "builtin", "decoder": "pil", "num_workers": 15, "pin_memory": True, "persistent_workers": True}
    metrics = {"data_wait_fraction": 0.6, "samples_per_s": 1500.0, "num_workers": 15, "decoder": "pil"}
    system = {"cpu_busy_cores": 15.8, "process_cpu_cores": 15.5, "main_process_cpu_cores": 1.0}
    measured = {"pil": 930.0, "turbo": 1350.0, "dali": 880.0}

    def ask(metrics=metrics, system=system, rates=measured, hardware=H100):
        return doctor.diagnose(
            metrics=metrics,
            system=system,
            hardware=hardware,
            flags={},
            data=jpeg,
            is_convnet=True,
            loader_rates=rates,
            facts=doctor.Facts(dali_installed=True),
        )

    d = ask()
    e = d["evidence"]
    assert (e["model_images_per_s"], e["loader_images_per_core_s"], e["loader_cores_needed"]) == (3750.0, 103.4, 36.25)
    assert "more workers cannot feed it" in d["verdict"], d["verdict"]
    assert "data.decoder=turbo about 150 per core, 25.0 cores (not enough)" in d["verdict"], d["verdict"]
    assert "data.loader=dali about 98 per core, 38.3 cores (not enough)" in d["verdict"], d["verdict"]
    assert d["try"][0] == "data.decoder=nvjpeg" and "data.loader=dali" not in d["try"]  # measured not to feed it
    # a decoder three times PIL's per core on this machine would feed it (7 cores of 15)
    d = ask(metrics=dict(metrics, data_wait_fraction=0.3), rates={"pil": 500.0, "turbo": 1500.0})
    assert "data.decoder=turbo about 310 per core, 6.9 cores (enough)" in d["verdict"], d["verdict"]
    assert d["try"][:2] == ["data.decoder=nvjpeg", "data.decoder=turbo"]
    # 4 workers that used 4 cores at 375 per core: 10 cores would do, and the node leaves 15
    d = ask(metrics=dict(metrics, num_workers=4), system=dict(system, process_cpu_cores=5.0))
    assert "more workers would feed it (data.num_workers=11)" in d["verdict"] and d["try"][0] == "data.num_workers=11"
    # never measured on this machine: the alternatives' rates are not guessed, and the benchmark is named
    d = ask(rates=None)
    assert "turbo about" not in d["verdict"] and "bench_loader_per_core.py --save" in d["verdict"]
    # 15 workers that used only 6 cores: enough of them, waiting on something else than their CPU
    d = ask(metrics=dict(metrics, data_wait_fraction=0.3), system=dict(system, process_cpu_cores=7.0))
    assert "its 15 workers could, and used only 6.0 cores" in d["verdict"], d["verdict"]
    assert not any(s.startswith("data.num_workers") for s in d["try"])
    # CIFAR-10's arrays decode nothing: no decoder is offered, nor measured against
    d = doctor.diagnose(
        metrics=dict(metrics, decoder=None),
        system=system,
        hardware=H100,
        flags={},
        data=dict(jpeg, name="cifar10"),
        is_convnet=True,
        loader_rates=measured,
    )
    assert "this loader (no decode)" in d["verdict"] and "about" not in d["verdict"], d["verdict"]
    assert not any(s.startswith(("data.decoder", "data.loader")) for s in d["try"]), d["try"]
    # the arithmetic is for a GPU's model; on a CPU the step shares the cores with the workers
    assert "model_images_per_s" not in ask(hardware=CPU)["evidence"]


def test_the_loader_rates_are_read_back_only_on_the_cpu_that_measured_them(tmp_path):
    import json

    from trainer.measure import loader_rates

    path = loader_rates.save({"pil": 930.04, "turbo": 1350}, 224, tmp_path / "rates.json")
    assert loader_rates.load(path) == {"pil": 930.0, "turbo": 1350.0}
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(record, cpu="another CPU")))
    assert loader_rates.load(path) is None
    assert loader_rates.load(tmp_path / "missing.json") is None


def test_a_cpu_run_whose_light_worker_leaves_a_core_idle_is_asked_to_measure_without_it():
    """One worker that used 0.2 of a core, the step on the one intra-op thread it leaves, 1.2 of 2 cores
    busy: the compute verdict says a core sat idle and offers data.num_workers=0 to measure."""
    args = dict(hardware=CPU, flags={}, data={"name": "builtin", "decoder": "pil", "num_workers": 1}, is_convnet=True)
    metrics = {"data_wait_fraction": 0.02, "num_workers": 1, "intra_op_threads": 1}
    light = {"cpu_busy_cores": 1.2, "process_cpu_cores": 1.2, "main_process_cpu_cores": 1.0}
    d = doctor.diagnose(metrics=metrics, system=light, **args)
    assert d["bottleneck"] == "compute" and "0.8 of 2 sat idle" in d["verdict"], d["verdict"]
    assert "data.num_workers=0" in d["try"]
    busy = dict(light, cpu_busy_cores=1.9, process_cpu_cores=1.9, main_process_cpu_cores=1.8)  # no core idle
    d = doctor.diagnose(metrics=metrics, system=busy, **args)
    assert d["bottleneck"] == "compute" and "data.num_workers=0" not in d["try"] and "sat idle" not in d["verdict"]
    every_core = dict(metrics, intra_op_threads=2)  # the step already had every core
    assert "sat idle" not in doctor.diagnose(metrics=every_core, system=light, **args)["verdict"]
