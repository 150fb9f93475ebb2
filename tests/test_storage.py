"""data.root as an fsspec URL, against a real S3 API on 127.0.0.1 (moto's server, authentication on).

Every format reads the same samples from S3 as from the local folder it was uploaded from; the
cache copies once, resumes a killed copy, and is shared by two DDP ranks; a missing bucket, a
wrong prefix, a wrong key and no credentials each give one paragraph, not a traceback.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, clean_env, read_metrics, run_cli

from trainer.data import ImageDataModule
from trainer.errors import ConfigError

pytestmark = pytest.mark.slow

NO_AUGMENT = ["data.augment=false", "data.image_size=32", "data.batch_size=10"]


@pytest.fixture(scope="module")
def formats(small_images, tmp_path_factory):
    """The small image folder packed in every format: {name: local root}."""
    from trainer.data.pack import pack

    out = tmp_path_factory.mktemp("formats")
    pack(small_images, str(out / "packed"), 32)
    pack(small_images, str(out / "parquet"), fmt="parquet", shard_samples=80, group_rows=20)
    pack(small_images, str(out / "webdataset"), fmt="webdataset", shard_samples=50)
    return {
        "imagefolder": small_images,
        "packed": str(out / "packed"),
        "parquet": str(out / "parquet"),
        "webdataset": str(out / "webdataset"),
    }


def _bucket(s3, name: str) -> str:
    fs = s3.fs()
    if not fs.exists(name):
        fs.mkdir(name)
    return name


def _upload(s3, local: str, url_path: str) -> str:
    fs = s3.fs()
    if not fs.exists(url_path):
        fs.put(local.rstrip("/") + "/", url_path, recursive=True)
    return f"s3://{url_path}"


@pytest.mark.parametrize("fmt", ["imagefolder", "packed", "parquet", "webdataset"])
def test_every_format_reads_the_same_samples_from_s3_as_from_disk(s3, formats, compose, fmt):
    url = _upload(s3, formats[fmt], f"{_bucket(s3, 'datasets')}/{fmt}")
    local = ImageDataModule(compose(f"data={fmt}", f"data.root={formats[fmt]}", *NO_AUGMENT).data)
    remote = ImageDataModule(compose(f"data={fmt}", f"data.root={url}", *NO_AUGMENT, "data.num_workers=2").data)
    assert local.build() == remote.build() == 10
    assert (
        remote.classes == local.classes
        and len(remote.train_set) == len(local.train_set)
        and len(remote.val_set) == len(local.val_set)
    )
    for i in (0, 7, len(local.train_set) - 1):
        (a, ya), (b, yb) = local.train_set[i], remote.train_set[i]
        assert ya == yb and torch.equal(a, b), i
    # through the loader's worker processes (each opens its own connection after fork)
    x, y = next(iter(remote.train_dataloader()))
    assert x.shape == (10, 3, 32, 32) and y.shape == (10,)


def test_the_cache_copies_once_checksummed_and_is_then_read_locally(s3, formats, compose, tmp_path, caplog):
    url = _upload(s3, formats["webdataset"], f"{_bucket(s3, 'datasets')}/cached-wds")
    cache = tmp_path / "cache"
    overrides = ("data=webdataset", f"data.root={url}", f"data.cache={cache}", *NO_AUGMENT)
    with caplog.at_level("INFO", logger="trainer.data.cache"):
        dm = ImageDataModule(compose(*overrides).data)
        assert dm.build() == 10
    copies = [p for p in cache.iterdir() if p.is_dir()]
    assert len(copies) == 1 and (copies[0] / "DONE").exists()
    manifest = json.loads((copies[0] / "MANIFEST.json").read_text())
    local_files = sorted(
        str(p.relative_to(formats["webdataset"])) for p in Path(formats["webdataset"]).rglob("*") if p.is_file()
    )
    assert (
        local_files and sorted(manifest) == local_files and all(e["version"] for e in manifest.values())
    )  # ETags recorded
    assert any("copied %d files" % len(local_files) in r.getMessage() for r in caplog.records)
    assert dm.train_set.load_block.fs.protocol in ("file", ("file", "local"))  # reads the local copy, not S3
    # a second build finds the finished copy: nothing fetched
    caplog.clear()
    with caplog.at_level("INFO", logger="trainer.data.cache"):
        ImageDataModule(compose(*overrides).data).build()
    assert not any("copied" in r.getMessage() for r in caplog.records)


def test_a_killed_cache_copy_resumes_where_it_stopped(s3, tmp_path):
    # 400 objects of 40-80 KB fetched 64 at a time; the manifest is saved after each batch, so a
    # kill after the first save leaves verified files behind that the second run must not fetch again
    src = tmp_path / "many"
    for c in range(4):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(100):
            (src / f"c{c}" / f"{i}.bin").write_bytes(bytes([c, i]) * (20_000 + 200 * i))
    url = _upload(s3, str(src), f"{_bucket(s3, 'resume')}/many")
    cache = tmp_path / "cache"
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); from "
        f"trainer.data.cache import cached_copy; print(cached_copy({url!r}, {str(cache)!r}))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 120
    while not list(cache.glob("*/MANIFEST.json")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    out = proc.communicate(timeout=30)[0]
    copy = next(cache.glob("many-*"))
    assert not (copy / "DONE").exists(), "the copy finished before it could be killed: " + out[-500:]
    done_before = len(json.loads((copy / "MANIFEST.json").read_text()))
    assert 0 < done_before < 400
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    copied = int(r.stderr.split("data.cache: copied ")[1].split()[0])
    reused = int(r.stderr.split(" files (")[1].split()[0])
    assert reused >= done_before and copied + reused == 400, r.stderr[-500:]
    for p in src.rglob("*.bin"):
        assert (copy / p.relative_to(src)).read_bytes() == p.read_bytes()
    assert not list(copy.rglob("*.part"))  # no torn file left in place


@pytest.mark.whole_machine  # two ranks: one core each
def test_two_ddp_ranks_share_one_cache_and_train_from_s3(s3, formats, tmp_path):
    url = _upload(s3, formats["parquet"], f"{_bucket(s3, 'datasets')}/ddp-parquet")
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        "data=parquet",
        f"data.root={url}",
        f"data.cache={cache}",
        "data.image_size=16",
        "data.batch_size=10",
        "strategy=ddp",
        "devices=2",
        "data.num_workers=2",
        "trainer.max_epochs=1",
        "model.width=8",
        "monitor.enabled=false",
        "checkpoint.enabled=false",
        env_extra=s3.env(),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["device"]["count"] == 2
    assert m["epochs"][0]["samples"] == 200  # 200 training images, each once: 100 per rank
    logs = (run_dir / "train.log").read_text() + (run_dir / "train_rank1.log").read_text()
    copies = [line for line in logs.splitlines() if "data.cache: copied" in line]
    assert len(copies) == 1 and " copied 0 " not in copies[0], copies  # one rank copied, the other waited and read it
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1


@pytest.mark.parametrize(
    "root, env, expected",
    [
        ("s3://no-such-bucket/data", {}, "the bucket 'no-such-bucket' does not exist"),
        ("s3://datasets/no/such/prefix", {}, "does not exist: nothing is stored at that path"),
        (
            "s3://datasets/imagefolder",
            {"AWS_ACCESS_KEY_ID": "AKIAWRONGKEY000000", "AWS_SECRET_ACCESS_KEY": "wrong"},
            "refused the credentials",
        ),
        (
            "s3://datasets/imagefolder",
            {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None},
            "no credentials for the object store",
        ),
    ],
    ids=["missing-bucket", "wrong-prefix", "wrong-key", "no-credentials"],
)
def test_storage_mistakes_are_one_clear_paragraph(s3, formats, compose, monkeypatch, root, env, expected):
    import s3fs

    _upload(s3, formats["imagefolder"], f"{_bucket(s3, 'datasets')}/imagefolder")
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(ConfigError) as e:
        ImageDataModule(compose("data=imagefolder", f"data.root={root}").data).build()
    assert expected in str(e.value) and "data.root" in str(e.value) and "\n" not in str(e.value)


def test_a_bad_root_url_from_the_command_line_is_one_paragraph_and_no_traceback(s3, tmp_path):
    r = run_cli(
        f"hydra.run.dir={tmp_path / 'run'}", "data=parquet", "data.root=s3://no-such-bucket/x", env_extra=s3.env()
    )
    assert r.returncode == 2
    assert "the bucket 'no-such-bucket' does not exist" in r.stderr and "Traceback" not in r.stderr + r.stdout
