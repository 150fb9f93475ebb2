"""data=cifar10 and data=imagenette: read from files in each dataset's real on-disk format (small ones,
written here: CIFAR-10's pickled batches, Imagenette's JPEG folders named by WordNet id), and
downloaded once from an archive served by a real HTTP server on 127.0.0.1 (the internet is never
reached). A download that fails, is cut short or is corrupt stops in one paragraph and leaves nothing
in the cache; a folder the trainer did not write is never touched."""

from __future__ import annotations

import hashlib
import http.server
import io
import logging
import pickle
import socket
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, run_cli
from PIL import Image

from trainer.config import check_overrides
from trainer.data import ImageDataModule
from trainer.errors import ConfigError

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_BATCH, TEST = 8, 10  # images per training batch file (5 files) and in test_batch


# ---------------------------------------------------------------------------------------------
# Files in the real formats


def write_cifar(folder: Path, seed: int = 0) -> dict:
    """``folder`` as cifar-10-python.tar.gz extracts it: pickled dicts of (N, 3072) uint8 rows and labels."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    written = {}
    for name, n in [(f"data_batch_{i}", PER_BATCH) for i in range(1, 6)] + [("test_batch", TEST)]:
        labels = [int(x) for x in rng.integers(0, 10, n)]
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        batch = {
            "batch_label": f"{name} of 5",
            "labels": labels,
            "data": data,
            "filenames": [f"{i}.png" for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        written[name] = batch
    meta = {"num_cases_per_batch": PER_BATCH, "label_names": CLASSES, "num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    (folder.parent / "readme.html").write_text("<html>CIFAR-10</html>")
    return written


def write_imagenette(folder: Path, per_class: int = 2, val: int = 1) -> None:
    """``folder`` (imagenette2-160/ or -320/) as its archive extracts it: train/<wnid>/*.JPEG, val/<wnid>/*.JPEG."""
    from trainer.data.standard import imagenette_wnids

    for i, wnid in enumerate(sorted(imagenette_wnids())):
        for split, n in (("train", per_class), ("val", val)):
            (folder / split / wnid).mkdir(parents=True)
            for j in range(n):
                image = Image.new("RGB", (48, 40), (25 * i, 60 + 40 * j, 200 - 15 * i))
                image.save(folder / split / wnid / f"{wnid}_{j}.JPEG", format="JPEG")


def tgz(root: Path) -> bytes:
    """A .tar.gz of ``root``'s contents, paths relative to it (the real archives hold their top folder)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(root.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cifar_tgz(tmp_path_factory) -> bytes:
    """A small cifar-10-python.tar.gz: cifar-10-batches-py/ and readme.html, as the real one."""
    src = tmp_path_factory.mktemp("cifar-src")
    write_cifar(src / "cifar-10-batches-py")
    return tgz(src)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


# ---------------------------------------------------------------------------------------------
# A real HTTP server on 127.0.0.1


class ArchiveServer:
    """Serves ``files`` (URL path -> bytes); a path in ``cut`` is sent with its whole length announced
    but only half its bytes before the connection closes; ``delay`` holds each answer back."""

    def __init__(self) -> None:
        self.files: dict = {}
        self.cut: set = set()
        self.delay = 0.0
        self.requests: list = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                server.requests.append(self.path)
                time.sleep(server.delay)
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if self.path in server.cut else data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server():
    s = ArchiveServer()
    yield s
    s.stop()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: the connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"


def leftovers(cache: Path) -> list:
    """What a failed download left in the cache: anything but its lock file."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


# ---------------------------------------------------------------------------------------------
# Reading files laid out as the real downloads


def test_cifar10_reads_the_pickled_batches_as_torchvision_lays_them_out(compose, tmp_path):
    written = write_cifar(tmp_path / "cifar" / "cifar-10-batches-py")
    cfg = compose(
        "data=cifar10",
        f"data.root={tmp_path / 'cifar'}",
        "data.batch_size=8",
        "data.image_size=16",
        "data.gpu_normalize=true",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 10 and dm.classes == CLASSES and dm.decoder is None
    assert len(dm.train_set) == 5 * PER_BATCH and len(dm.val_set) == TEST
    # sample 13 is the 6th image of data_batch_2, as CHW pixels; test_batch is the validation set
    from trainer.data.standard import cifar_images

    folder = str(tmp_path / "cifar" / "cifar-10-batches-py")
    raw = cifar_images(folder, train=True)
    image, label = raw[13]
    assert label == written["data_batch_2"]["labels"][5]
    assert torch.equal(image, torch.from_numpy(written["data_batch_2"]["data"][5].reshape(3, 32, 32)))
    assert cifar_images(folder, train=False).targets == written["test_batch"]["labels"]
    # the image folder's transforms apply: resized to data.image_size, uint8 with gpu_normalize
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 16, 16) and x.dtype == torch.uint8 and y.dtype == torch.int64
    # data.root may also name cifar-10-batches-py itself
    cfg = compose("data=cifar10", f"data.root={folder}")
    assert ImageDataModule(cfg.data, cfg.seed).build() == 10


def test_cifar10_samples_survive_pickling_for_loader_workers(tmp_path):
    from trainer.data.standard import cifar_images

    write_cifar(tmp_path / "cifar-10-batches-py")
    dataset = cifar_images(str(tmp_path / "cifar-10-batches-py"), train=False)
    copy = pickle.loads(pickle.dumps(dataset))
    assert type(copy).__name__ == "CifarImages" and torch.equal(copy[3][0], dataset[3][0])


def test_python_train_py_data_cifar10_trains(train, tmp_path):
    write_cifar(tmp_path / "cifar" / "cifar-10-batches-py")
    m, _ = train("data=cifar10", f"data.root={tmp_path / 'cifar'}", "data.num_workers=1")
    assert m["status"] == "ok", m.get("error")
    assert m["epochs"][0]["samples"] == 5 * PER_BATCH and m["val_samples"] == TEST
    assert m["decoder"] is None and m["data"]["name"] == "cifar10"


def test_cifar10_says_which_switches_do_not_apply(compose, tmp_path, caplog):
    write_cifar(tmp_path / "cifar-10-batches-py")
    base = ("data=cifar10", f"data.root={tmp_path}")
    with caplog.at_level(logging.WARNING, logger="trainer.data.datamodule"):
        cfg = compose(*base)
        ImageDataModule(cfg.data, cfg.seed).build()
        assert caplog.records == []
        cfg = compose(*base, "data.decoder=turbo", "data.decode_scale=auto", "data.cache_in_memory=true")
        ImageDataModule(cfg.data, cfg.seed).build()
    [record] = caplog.records
    said = record.getMessage()
    assert (
        "data.decoder=turbo, data.decode_scale=auto, data.cache_in_memory=true changes nothing with data=cifar10"
        in said
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.data.standard"):  # data.root is read, never downloaded into
        cfg = compose(*base, "data.download_url=https://mirror.example/c.tgz")
        ImageDataModule(cfg.data, cfg.seed).build()
    said = [r.getMessage().split(":")[0] for r in caplog.records]
    assert said == ["data.download_url and data.download_md5 are not used"]


def test_imagenette_reads_the_image_folders_as_torchvision_does(compose, tmp_path):
    from torchvision.datasets import Imagenette

    write_imagenette(tmp_path / "nette" / "imagenette2-160")
    cfg = compose(
        "data=imagenette",
        f"data.root={tmp_path / 'nette'}",
        "data.image_size=16",
        "data.batch_size=4",
        "data.decoder=torchvision",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 10 and dm.decoder == "torchvision"
    assert dm.classes[:3] == ["tench", "English springer", "cassette player"]
    for split, dataset in (("train", dm.train_set), ("val", dm.val_set)):
        theirs = Imagenette(str(tmp_path / "nette"), split=split, size="160px")
        assert dataset.samples == theirs._samples and len(dataset) == (20 if split == "train" else 10)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16) and x.dtype == torch.uint8  # normalized after the loader (data.gpu_normalize)


def test_python_train_py_data_imagenette_trains(train, tmp_path):
    write_imagenette(tmp_path / "nette" / "imagenette2-160")
    m, _ = train("data=imagenette", f"data.root={tmp_path / 'nette'}", "data.batch_size=4", "data.decode_scale=auto")
    assert m["status"] == "ok", m.get("error")
    assert m["epochs"][0]["samples"] == 20 and m["val_samples"] == 10 and m["decoder"] == "pil"


@pytest.mark.parametrize(
    "case",
    ["cifar without test_batch", "cifar truncated batch", "imagenette of another size", "imagenette missing a class"],
)
def test_a_wrong_layout_under_data_root_is_one_paragraph(compose, tmp_path, case):
    import shutil

    from trainer.data.standard import imagenette_wnids

    if case.startswith("cifar"):
        folder = tmp_path / "data" / "cifar-10-batches-py"
        write_cifar(folder)
        if case == "cifar without test_batch":
            (folder / "test_batch").unlink()
            says = "lacks test_batch"
        else:
            whole = (folder / "data_batch_3").read_bytes()
            (folder / "data_batch_3").write_bytes(whole[: len(whole) // 2])
            says = "cannot be read as CIFAR-10's pickled batches"
        name = "cifar10"
    else:
        write_imagenette(tmp_path / "data" / "imagenette2-320")
        if case == "imagenette missing a class":
            shutil.rmtree(tmp_path / "data" / "imagenette2-320" / "val" / sorted(imagenette_wnids())[4])
            says = "val lacks n03028079"
        else:
            says = "It holds imagenette2-320/ (data.imagenette_size=320px)"
        name = "imagenette"
    size = ["data.imagenette_size=320px"] if case == "imagenette missing a class" else []
    cfg = compose(f"data={name}", f"data.root={tmp_path / 'data'}", *size)
    with pytest.raises(ConfigError) as e:
        ImageDataModule(cfg.data, cfg.seed).build()
    assert says in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# The download


def test_cifar10_is_downloaded_once_from_a_local_server_and_trains(train, compose, server, cifar_tgz, tmp_path):
    cache = tmp_path / "cache"
    server.files["/cifar-10-python.tar.gz"] = cifar_tgz
    args = (
        "data=cifar10",
        f"data.cache_dir={cache}",
        f"data.download_url={server.url('/cifar-10-python.tar.gz')}",
        f"data.download_md5={md5(cifar_tgz)}",
    )
    m, _ = train(*args)
    assert m["status"] == "ok", m.get("error")
    assert m["epochs"][0]["samples"] == 5 * PER_BATCH and m["val_samples"] == TEST
    assert server.requests == ["/cifar-10-python.tar.gz"]
    # laid out as torchvision's download, marked done; the archive and the temp dir are gone
    assert sorted(p.name for p in (cache / "cifar10").iterdir()) == ["DONE", "cifar-10-batches-py", "readme.html"]
    assert leftovers(cache) == ["cifar10"]
    cfg = compose(*args)
    assert ImageDataModule(cfg.data, cfg.seed).build() == 10 and server.requests == ["/cifar-10-python.tar.gz"]  # once


def test_imagenette_is_downloaded_into_torchvisions_layout(compose, server, tmp_path):
    from torchvision.datasets import Imagenette

    src = tmp_path / "src"
    write_imagenette(src / "imagenette2-320")
    server.files["/mirror/imagenette2-320.tgz"] = tgz(src)
    cache = tmp_path / "cache"
    cfg = compose(
        "data=imagenette",
        "data.imagenette_size=320px",
        f"data.cache_dir={cache}",
        f"data.download_url={server.url('/mirror/imagenette2-320.tgz')}",
        "data.download_md5=null",
        "data.image_size=16",
        "data.batch_size=4",
    )
    dm = ImageDataModule(cfg.data, cfg.seed)
    assert dm.build() == 10 and len(dm.train_set) == 20 and len(dm.val_set) == 10
    assert dm.train_set.samples == Imagenette(str(cache / "imagenette-320px"), split="train", size="320px")._samples
    assert leftovers(cache) == ["imagenette-320px"] and server.requests == ["/mirror/imagenette2-320.tgz"]


def _bad_download(case: str, server, cifar_tgz, src: Path) -> tuple:
    """(download URL, MD5 override, text the paragraph must hold) for each way a download goes wrong."""
    path = "/cifar-10-python.tar.gz"
    if case == "corrupt":
        server.files[path] = cifar_tgz[:100] + bytes(b ^ 0xFF for b in cifar_tgz[100:200]) + cifar_tgz[200:]
        return server.url(path), md5(cifar_tgz), f"not {md5(cifar_tgz)}: it is corrupt, cut short, or another file"
    if case == "truncated, not checked":
        server.files[path] = cifar_tgz[: len(cifar_tgz) // 2]
        return server.url(path), "null", "cannot be extracted"
    if case == "a web page, not checked":  # what a proxy's login page looks like to the download
        server.files[path] = b"<html><body>Please sign in to continue</body></html>"
        return server.url(path), "null", "(ReadError: file could not be opened successfully): it is truncated or not"
    if case == "another dataset, not checked":
        server.files[path] = tgz(src)
        return server.url(path), "null", "does not hold the dataset as torchvision lays it out"
    if case == "cut short":
        server.files[path], server.cut = cifar_tgz, {path}
        return server.url(path), "null", f"the connection ended after {len(cifar_tgz) // 2} of {len(cifar_tgz)} bytes"
    if case == "not found":
        return server.url("/gone.tar.gz"), "auto", "(HTTP 404 Not Found)"
    return closed_port_url(), "auto", "Connection refused"


@pytest.mark.parametrize(
    "case",
    [
        "corrupt",
        "truncated, not checked",
        "a web page, not checked",
        "another dataset, not checked",
        "cut short",
        "not found",
        "offline",
    ],
)
def test_a_failed_download_is_one_paragraph_and_keeps_nothing(compose, server, cifar_tgz, tmp_path, case):
    write_imagenette(tmp_path / "src" / "imagenette2-160", per_class=1, val=1)
    url, checksum, says = _bad_download(case, server, cifar_tgz, tmp_path / "src")
    cache = tmp_path / "cache"
    cfg = compose(
        "data=cifar10", f"data.cache_dir={cache}", f"data.download_url={url}", f"data.download_md5={checksum}"
    )
    with pytest.raises(ConfigError) as e:
        ImageDataModule(cfg.data, cfg.seed).build()
    message = str(e.value)
    assert says in message and "othing was kept" in message, message
    assert "\n" not in message
    assert leftovers(cache) == []  # no archive, no temp dir, no half-extracted dataset
    if case in ("not found", "offline", "cut short"):  # where to put the files by hand, and what goes there
        assert f"put it in {cache}/" in message and "cifar-10-python.tar.gz" in message
        assert (
            "data.root=DIR, where DIR/cifar-10-batches-py/ holds data_batch_1 ... data_batch_5, test_batch" in message
        )


def test_an_archive_put_in_the_cache_by_hand_is_used_and_kept(compose, cifar_tgz, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "cifar-10-python.tar.gz").write_bytes(cifar_tgz)
    cfg = compose(
        "data=cifar10",
        f"data.cache_dir={cache}",
        f"data.download_url={closed_port_url()}",
        f"data.download_md5={md5(cifar_tgz)}",
    )
    assert ImageDataModule(cfg.data, cfg.seed).build() == 10
    assert (cache / "cifar-10-python.tar.gz").read_bytes() == cifar_tgz  # the user's file, left as it was
    assert (cache / "cifar10" / "DONE").exists()


def test_a_killed_downloads_leftover_is_cleared_and_a_foreign_folder_is_left_alone(
    compose, server, cifar_tgz, tmp_path
):
    cache = tmp_path / "cache"
    server.files["/c.tgz"] = cifar_tgz
    args = (
        "data=cifar10",
        f"data.cache_dir={cache}",
        f"data.download_url={server.url('/c.tgz')}",
        "data.download_md5=null",
    )
    # a folder named as the dataset that the trainer did not finish: refused, untouched, nothing fetched
    (cache / "cifar10").mkdir(parents=True)
    (cache / "cifar10" / "notes.txt").write_text("mine")
    cfg = compose(*args)
    with pytest.raises(ConfigError, match="holds no finished download"):
        ImageDataModule(cfg.data, cfg.seed).build()
    assert (cache / "cifar10" / "notes.txt").read_text() == "mine" and server.requests == []
    (cache / "cifar10" / "notes.txt").unlink()
    (cache / "cifar10").rmdir()
    # the temp dir of a download killed half-way is never taken for the dataset, and is cleared
    (cache / ".cifar10-killed" / "cifar-10-batches-py").mkdir(parents=True)
    (cache / ".cifar10-killed" / "cifar-10-python.tar.gz.part").write_bytes(cifar_tgz[:50])
    assert ImageDataModule(cfg.data, cfg.seed).build() == 10
    assert leftovers(cache) == ["cifar10"] and server.requests == ["/c.tgz"]


def test_processes_starting_together_download_once(server, cifar_tgz, tmp_path):
    """Ranks of one node: one downloads while the others wait on the lock, then all read its copy."""
    from trainer.data.standard import ensure, standard

    server.files["/c.tgz"], server.delay = cifar_tgz, 0.5
    found = []

    def get():
        found.append(ensure(standard("cifar10"), str(tmp_path / "cache"), server.url("/c.tgz"), None))

    threads = [threading.Thread(target=get) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(found) == 3 and len(set(found)) == 1 and server.requests == ["/c.tgz"]


@pytest.mark.parametrize(
    "override, says",
    [
        ("data.download_md5=abc", "It must be auto (torchvision's checksum of the archive), 32 hex digits"),
        (
            "data.download_url=www.example.org/c.tgz",
            "It must be auto (torchvision's URL for the dataset) or an http://",
        ),
        ("data.imagenette_size=200px", "Allowed values: 160px, 320px, full"),
    ],
)
def test_bad_download_keys_name_the_key_and_what_is_allowed(override, says):
    with pytest.raises(ConfigError) as e:
        check_overrides([override], [])
    assert f"'{override.split('=')[0]}'" in str(e.value) and says in str(e.value)


@pytest.mark.slow
def test_an_offline_download_stops_train_py_with_one_paragraph(tmp_path):
    r = run_cli(
        f"hydra.run.dir={tmp_path / 'run'}",
        *TINY,
        "data=cifar10",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"data.download_url={closed_port_url()}",
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "data=cifar10 could not download" in r.stderr and f"put it in {tmp_path / 'cache'}/" in r.stderr
    assert "Traceback" not in out and leftovers(tmp_path / "cache") == []
