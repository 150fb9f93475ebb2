"""The input pipeline switches: each one changes what the loader delivers or how it works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from trainer.data import ImageDataModule


def _jpeg_folder(root: Path, classes=("a", "b", "c"), per_class=6, size=40) -> Path:
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (size, size), (80 * i, 30 * j, 120)).save(root / cls / f"{j}.jpg", quality=90)
    return root


def _first_batch(compose, *overrides):
    cfg = compose(*overrides)
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    return dm, next(iter(dm.train_dataloader()))


def test_gpu_normalize_ships_uint8_and_the_model_normalizes(compose, train, tmp_path):
    _, (x, _) = _first_batch(compose, "data.gpu_normalize=true", "data.image_size=16", "data.batch_size=4")
    assert x.dtype == torch.uint8
    _, (x, _) = _first_batch(compose, "data.image_size=16", "data.batch_size=4")
    assert x.dtype == torch.float32
    root = _jpeg_folder(tmp_path / "imgs")
    _, (x, _) = _first_batch(compose, "data=imagefolder", f"data.root={root}", "data.gpu_normalize=true", "data.image_size=16", "data.batch_size=4")
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16)
    import probe

    probe.SEEN.clear()
    m, _ = train("data.gpu_normalize=true", "model._target_=probe.ProbeNet", "~model.width")
    assert m["status"] == "ok" and all(s["input_dtype"] == torch.float32 for s in probe.SEEN)  # converted on the device
    assert m["flags"]["data.gpu_normalize"] is True


@pytest.mark.parametrize("decoder", ["pil", "torchvision", "turbo"])
def test_decoders_deliver_the_same_images(compose, tmp_path, decoder):
    root = _jpeg_folder(tmp_path / "imgs")
    dm, (x, y) = _first_batch(compose, "data=imagefolder", f"data.root={root}", f"data.decoder={decoder}", "data.augment=false", "data.val_split=0", "data.image_size=32", "data.batch_size=4")
    ref_dm, (ref, _) = _first_batch(compose, "data=imagefolder", f"data.root={root}", "data.decoder=pil", "data.augment=false", "data.val_split=0", "data.image_size=32", "data.batch_size=4")
    assert x.shape == ref.shape and torch.allclose(x, ref, atol=0.15)  # JPEG decoders differ by a few levels
    import importlib.util

    expected = decoder if (decoder != "turbo" or importlib.util.find_spec("simplejpeg")) else "torchvision"
    assert dm.decoder == expected


def test_nvjpeg_without_cuda_falls_back_with_a_message(compose, tmp_path, caplog):
    root = _jpeg_folder(tmp_path / "imgs")
    dm, _ = _first_batch(compose, "data=imagefolder", f"data.root={root}", "data.decoder=nvjpeg", "data.image_size=16", "data.batch_size=2")
    assert dm.decoder == "torchvision" and "needs a CUDA GPU" in caplog.text


def test_cache_in_memory_reads_each_file_once(compose, tmp_path, monkeypatch):
    import builtins

    root = _jpeg_folder(tmp_path / "imgs")
    cfg = compose("data=imagefolder", f"data.root={root}", "data.cache_in_memory=true", "data.val_split=0", "data.image_size=16", "data.batch_size=6")
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    opened = []
    real_open = builtins.open

    def counting_open(path, *a, **k):
        if str(path).endswith(".jpg"):
            opened.append(str(path))
        return real_open(path, *a, **k)

    monkeypatch.setattr(builtins, "open", counting_open)
    for _ in range(2):  # two epochs, main-process loading
        for _batch in dm.train_dataloader():
            pass
    assert len(opened) == 18 and len(set(opened)) == 18  # 18 files, each opened once over two epochs


def test_auto_workers_follow_the_cores(compose, caplog):
    import logging
    import os

    caplog.set_level(logging.INFO)
    cores = len(os.sched_getaffinity(0))
    cfg = compose("data.auto_workers=true")
    assert ImageDataModule(cfg.data, cfg.seed).num_workers == max(0, min(16, cores - 1))
    assert ImageDataModule(cfg.data, cfg.seed, processes_per_node=cores).num_workers == 0
    assert "data.auto_workers" in caplog.text


def test_pack_and_train_from_packed(tmp_path, train):
    src = _jpeg_folder(tmp_path / "imgs", per_class=10)
    dst = tmp_path / "packed"
    r = subprocess.run([sys.executable, "-m", "trainer.pack", str(src), str(dst), "--size", "24"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {p.name for p in dst.iterdir()} == {"images.npy", "labels.npy", "meta.json"}
    r = subprocess.run([sys.executable, "-m", "trainer.pack", str(src), str(dst)], capture_output=True, text=True)
    assert r.returncode != 0 and "already holds a packed dataset" in (r.stderr + r.stdout)
    m, _ = train("data=packed", f"data.root={dst}", "data.image_size=16", "data.batch_size=4", "data.val_split=0.2")
    assert m["status"] == "ok" and m["epochs"][0]["samples"] == 24


def test_packed_shards_exactly_across_ranks_and_workers(tmp_path):
    """Every sample once per epoch across 2 ranks x 2 workers (what Lightning's DistributedSampler does)."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    from trainer.data.packed import PackedImages
    from trainer.pack import pack

    src = _jpeg_folder(tmp_path / "imgs", per_class=8)
    pack(str(src), str(tmp_path / "p"), 16)

    class Indexed(PackedImages):
        def __getitem__(self, i):
            return i

    dataset = Indexed(str(tmp_path / "p"), 16, True, True, True)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=3, drop_last=False)
        sampler.set_epoch(1)
        seen += [int(i) for batch in DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2) for i in batch]
    assert sorted(seen) == list(range(len(dataset)))


def test_data_only_benchmark_runs(tmp_path):
    out = tmp_path / "bench.json"
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "scripts" / "bench_data.py"), "--config", "data.image_size=16 data.num_samples=64 data.batch_size=8", "--batches", "3", "--repeats", "1", "--out", str(out)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    (result,) = json.loads(out.read_text())
    assert result["images_per_s"] > 0 and "images/s" in r.stdout


def _copy_in_child(args):
    from trainer.data import cache

    return cache.cached_copy(*args)


def test_data_cache_copies_once_checksummed_resumable_and_locked(tmp_path, monkeypatch, compose):
    import multiprocessing as mp

    from trainer.data import cache

    src = _jpeg_folder(tmp_path / "remote", per_class=4)
    calls = tmp_path / "copy_calls"
    original = cache._copy

    def recording_copy(s, d):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\n")
        return original(s, d)

    import os

    monkeypatch.setattr(cache, "_copy", recording_copy)
    with mp.get_context("fork").Pool(2) as pool:  # two "ranks" at once: one copies, the other waits
        paths = pool.map(_copy_in_child, [(str(src), str(tmp_path / "local"))] * 2)
    assert paths[0] == paths[1] and len(calls.read_text().split()) == 1
    local = Path(paths[0])
    assert sorted(p.name for p in (local / "a").iterdir()) == sorted(p.name for p in (src / "a").iterdir())
    manifest = __import__("json").loads((local / "MANIFEST.json").read_text())
    assert len(manifest) == 12 and all(len(v["sha256"]) == 64 for v in manifest.values())

    # an interrupted copy resumes: drop the DONE marker and one file, corrupt another
    (local / "DONE").unlink()
    (local / "b" / "0.jpg").unlink()
    (local / "c" / "1.jpg").write_bytes(b"torn")
    before = (local / "a" / "0.jpg").stat().st_mtime_ns
    cache.cached_copy(str(src), str(tmp_path / "local"))
    assert (local / "b" / "0.jpg").read_bytes() == (src / "b" / "0.jpg").read_bytes()
    assert (local / "c" / "1.jpg").read_bytes() == (src / "c" / "1.jpg").read_bytes()
    assert (local / "a" / "0.jpg").stat().st_mtime_ns == before  # good files are not copied again

    cfg = compose("data=imagefolder", f"data.root={src}", f"data.cache={tmp_path / 'local'}", "data.image_size=16", "data.batch_size=2")
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    assert str(dm.train_set.dataset.root).startswith(str(local))


@pytest.mark.parametrize("name", ["jemalloc", "tcmalloc"])
def test_allocator_is_preloaded_and_recorded(tmp_path, name):
    from conftest import read_metrics, run_cli

    from trainer.launch import find_allocator

    if find_allocator(name) is None:
        pytest.skip(f"{name} is not installed (Debian: libjemalloc2 / libtcmalloc-minimal4; .ci/run installs them)")
    run_dir = tmp_path / name
    r = run_cli(f"hydra.run.dir={run_dir}", f"runtime.allocator={name}", "trainer.max_epochs=1", "data.num_samples=64", "checkpoint.enabled=false")
    assert r.returncode == 0, r.stderr[-2000:]
    m = read_metrics(run_dir)
    assert m["flags"]["runtime.allocator"] == name and m["allocator"] == name  # really mapped into the process


def test_missing_allocator_is_a_clear_error(compose, monkeypatch):
    from trainer import launch
    from trainer.errors import ConfigError

    monkeypatch.setattr(launch, "find_allocator", lambda name: None)
    with pytest.raises(ConfigError, match="apt-get install libjemalloc2"):
        launch.allocator_env(compose("runtime.allocator=jemalloc"))
    assert launch.allocator_env(compose()) == {}
