"""Standard datasets by name: ``data=cifar10`` and ``data=imagenette``, downloaded once into the trainer's cache.

Time-to-accuracy numbers mean something to others only on data they know. These two are the ones
speed-run results are quoted on (CIFAR-10: the 94%-in-seconds runs; Imagenette: the ten-class
ImageNet subset of fast.ai's leaderboard and FFCV's examples), so they can be named instead of
laid out by hand. They are read with torchvision's own code and tables (its ``CIFAR10`` class, its
Imagenette URLs, checksums and WordNet-id-to-name table) and train through the same transforms,
workers and switches as an image folder:

- ``cifar10``: torchvision's ``cifar-10-batches-py`` (five pickled training batches, 50,000 images;
  ``test_batch``, 10,000, is the validation set). Its images are raw uint8 32x32 pixels held in
  memory, so they get the image folder's transforms (augmentation, resize to ``data.image_size``,
  ``data.gpu_normalize``'s uint8 path) with no decode: ``data.decoder``, ``data.decode_scale`` and
  ``data.cache_in_memory`` do not apply, and the run says so when one is set.
- ``imagenette``: ``imagenette2-160`` / ``-320`` / ``imagenette2`` (``data.imagenette_size``), real
  JPEGs in an image folder layout (``train/<wnid>/*.JPEG``, ``val/<wnid>/...``), read by the image
  folder path itself: every decoder, ``data.decode_scale``, ``data.cache_in_memory`` apply.

With ``data.root`` unset, the archive is fetched from ``data.download_url`` (torchvision's URL by
default) into a temp dir inside the cache dir, checked against ``data.download_md5`` (torchvision's
by default), extracted there, checked for the files the dataset needs, marked DONE and renamed into
place; on any failure the temp dir is removed, so a download cut short is never taken for a
dataset. One process downloads while the others (ranks of the same node) wait on a lock. With
``data.root`` set, the files there are read as they are; nothing is downloaded.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import http.client
import logging
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torchvision.datasets import CIFAR10, Imagenette

from trainer.data.folder import transforms_for
from trainer.data.storage import is_remote
from trainer.errors import ConfigError
from trainer.paths import default_cache_dir

log = logging.getLogger(__name__)

DONE = "DONE"  # written last into a finished download: a folder without it is not a dataset
TIMEOUT_S = 60  # per socket operation: a server that stops sending fails the download instead of hanging
USER_AGENT = "pytorch/vision"  # what torchvision's own downloads send
CIFAR_FILES = (
    "data_batch_1",
    "data_batch_2",
    "data_batch_3",
    "data_batch_4",
    "data_batch_5",
    "test_batch",
    "batches.meta",
)
IMAGENETTE_SIZES = ("160px", "320px", "full")


@dataclass(frozen=True)
class Standard:
    """One standard dataset: where its archive comes from and what it must hold once extracted."""

    name: str  # data=NAME
    cache_name: str  # its folder under the cache dir
    url: str  # torchvision's
    md5: str  # torchvision's, of the archive
    filename: str  # the archive's file name
    folder: str  # the folder the archive extracts to (torchvision's layout)
    holds: str  # what that folder holds, for messages
    layout_problem: Callable[[str], Optional[str]]  # folder -> what is missing or wrong, None if fine


def _cifar_problem(folder: str) -> Optional[str]:
    missing = [f for f in CIFAR_FILES if not os.path.isfile(os.path.join(folder, f))]
    if len(missing) == len(CIFAR_FILES):
        return f"{folder} holds none of its files"
    return f"{folder} lacks {', '.join(missing)}" if missing else None


def imagenette_wnids() -> dict:
    """WordNet id -> class names, torchvision's own table."""
    return dict(Imagenette._WNID_TO_CLASS)


def _imagenette_problem(folder: str) -> Optional[str]:
    wnids = set(imagenette_wnids())
    for split in ("train", "val"):
        path = os.path.join(folder, split)
        if not os.path.isdir(path):
            return f"{folder} has no {split}/ folder"
        found = {e.name for e in os.scandir(path) if e.is_dir()}
        if found != wnids:
            missing, foreign = sorted(wnids - found), sorted(found - wnids)
            said = ([f"lacks {', '.join(missing)}"] if missing else []) + (
                [f"has class folders that are not Imagenette's ({', '.join(foreign[:4])})"] if foreign else []
            )
            return f"{path} {' and '.join(said)}"
    return None


def standard(name: str, imagenette_size: str = "160px") -> Standard:
    """The dataset ``data=name`` names, with torchvision's URL and MD5 for it."""
    if name == "cifar10":
        return Standard(
            "cifar10",
            "cifar10",
            CIFAR10.url,
            CIFAR10.tgz_md5,
            CIFAR10.filename,
            CIFAR10.base_folder,
            "data_batch_1 ... data_batch_5, test_batch and batches.meta",
            _cifar_problem,
        )

    url, md5 = Imagenette._ARCHIVES[imagenette_size]
    return Standard(
        "imagenette",
        f"imagenette-{imagenette_size}",
        url,
        md5,
        Path(url).name,
        Path(url).stem,
        "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG, one folder per class named by its WordNet id (n01440764, ...)",
        _imagenette_problem,
    )


def dataset_folder(cfg, local_root) -> tuple:
    """(the dataset's folder in torchvision's layout, the key that names it in messages).

    ``data.root`` set: that folder (or the dataset's folder inside it), read as it is; unset: the
    copy in the cache dir, downloaded on first use. ``local_root`` applies ``data.cache``.
    """
    ds = standard(cfg.name, cfg.get("imagenette_size", "160px"))
    if not cfg.root:
        return ensure(ds, cfg.get("cache_dir"), cfg.get("download_url", "auto"), cfg.get("download_md5", "auto")), (
            "data.cache_dir"
        )
    if cfg.get("download_url", "auto") != "auto" or cfg.get("download_md5", "auto") != "auto":
        log.warning("data.download_url and data.download_md5 are not used: data.root=%s is read as it is", cfg.root)
    root = local_root(cfg.root)
    if is_remote(root):
        raise ConfigError(
            f"'data.root={cfg.root}': data={ds.name} reads its files from local disk. Add data.cache=DIR to copy them "
            "there once (checksummed, resumable), or leave data.root unset to download the dataset into the trainer's cache."
        )
    return user_folder(ds, os.path.expanduser(str(root))), "data.root"


def user_folder(ds: Standard, root: str) -> str:
    """The dataset's folder under a user's ``data.root``: ``root/<folder>`` or ``root`` itself, checked."""
    inside = os.path.join(root, ds.folder)
    folder = inside if os.path.isdir(inside) else root
    problem = ds.layout_problem(folder) if os.path.isdir(folder) else f"{root} does not exist or is not a folder"
    if problem is None:
        return folder
    other = ""
    if ds.name == "imagenette" and os.path.isdir(root):
        sizes = {standard("imagenette", s).folder: s for s in IMAGENETTE_SIZES}
        present = [f"{f}/ (data.imagenette_size={s})" for f, s in sizes.items() if os.path.isdir(os.path.join(root, f))]
        other = f" It holds {', '.join(present)}." if present else ""
    raise ConfigError(
        f"'data.root={root}' does not hold {ds.name} as torchvision lays it out: {problem}.{other} Expected "
        f"DIR/{ds.folder}/ with {ds.holds} (what {ds.filename} extracts to), or data.root pointing at {ds.folder}/ "
        "itself. Leave data.root unset to download it once into the trainer's cache."
    )


# ---------------------------------------------------------------------------------------------
# The download: fetched, checked and extracted in a temp dir, renamed into place when whole.


def ensure(ds: Standard, cache_dir: Optional[str], url: str = "auto", md5: Optional[str] = "auto") -> str:
    """The dataset's folder in the cache (downloaded, checked and extracted on first use)."""
    cache = os.path.expanduser(cache_dir or default_cache_dir())
    final = os.path.join(cache, ds.cache_name)
    if os.path.isfile(os.path.join(final, DONE)):
        return os.path.join(final, ds.folder)
    try:
        os.makedirs(cache, exist_ok=True)
        lock = open(os.path.join(cache, f".{ds.cache_name}.lock"), "a")
    except OSError as e:
        raise ConfigError(
            f"data={ds.name}: the trainer's cache {cache} cannot be written ({e.strerror}), so the dataset cannot be downloaded "
            "into it. Point data.cache_dir (or $TRAINER_CACHE) at a writable folder, or give data.root=DIR holding the files."
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process downloads; the others wait here, then find it DONE
        if os.path.isfile(os.path.join(final, DONE)):
            return os.path.join(final, ds.folder)
        if os.path.exists(final) and (not os.path.isdir(final) or os.listdir(final)):
            raise ConfigError(
                f"data={ds.name}: {final} already exists but holds no finished download (no {DONE} file, which the trainer "
                "writes last); it was left as it is, since the trainer never overwrites what it did not write. If it holds "
                f"the dataset, run with data.root={final}; otherwise move it away, or point data.cache_dir elsewhere."
            )
        # the temp dir of a download killed earlier: ours by its name, and nobody's now (we hold the lock)
        for leftover in glob.glob(os.path.join(cache, f".{ds.cache_name}-*")):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{ds.cache_name}-", dir=cache)
        try:
            _fill(ds, cache, tmp, ds.url if url in (None, "auto") else url, ds.md5 if md5 == "auto" else md5)
            open(os.path.join(tmp, DONE), "w").close()
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("data=%s: ready in %s", ds.name, final)
    return os.path.join(final, ds.folder)


def _fill(ds: Standard, cache: str, tmp: str, url: str, md5: Optional[str]) -> None:
    """The archive (placed in the cache by the user, or downloaded into ``tmp``), checked and extracted into ``tmp``."""
    placed = os.path.join(cache, ds.filename)
    if os.path.isfile(placed):  # a copy fetched elsewhere: used, checked, never deleted (it is the user's)
        log.info("data=%s: extracting %s (found in the cache; not downloading)", ds.name, placed)
        archive, digest, source = placed, _file_md5(placed), placed
    else:
        archive, source = os.path.join(tmp, ds.filename + ".part"), url
        digest = _download(ds, url, archive, cache)
    if md5 and digest != md5.lower():
        raise ConfigError(
            f"data={ds.name}: the archive from {source} has MD5 {digest}, not {md5.lower()}: it is corrupt, cut short, or another "
            f"file. Nothing was kept{' but that file, which is yours' if source == placed else ''}. "
            f"Replace it with a whole copy of {ds.filename} or run again; set data.download_md5=null only for a mirror you trust "
            "that packs the same files differently."
        )
    _extract(ds, archive, tmp, source)
    if archive != placed:
        os.remove(archive)
    problem = ds.layout_problem(os.path.join(tmp, ds.folder))
    if problem is not None:
        raise ConfigError(
            f"data={ds.name}: the archive from {source} does not hold the dataset as torchvision lays it out "
            f"({problem.replace(tmp, ds.cache_name)}). Nothing was kept. Expected {ds.folder}/ with {ds.holds}."
        )


def _file_md5(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "md5").hexdigest()


def offline_help(ds: Standard, cache: str, url: str, reason: str) -> str:
    """The paragraph for a download that did not happen: where to put the files by hand, and what goes there."""
    return (
        f"data={ds.name} could not download {url} ({reason}); nothing was kept. Without internet access, get "
        f"{ds.filename} on another machine (from {url}) and either put it in {cache}/ (it is checked against its MD5 "
        f"and extracted on the next run, and left there), or extract it and run with data.root=DIR, where "
        f"DIR/{ds.folder}/ holds {ds.holds}. Behind a proxy, set HTTPS_PROXY (and HTTP_PROXY), which the download "
        "honours; data.download_url=URL fetches the same archive from a mirror."
    )


def _download(ds: Standard, url: str, part: str, cache: str) -> str:
    """``url`` -> the file ``part`` (streamed); returns its MD5. A failure is one paragraph, and the
    caller removes ``part`` with its temp dir."""
    digest, got, total = hashlib.md5(), 0, None
    try:
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response, open(part, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            size = f" ({total / 1e6:.0f} MB)" if total else ""
            log.info("data=%s: downloading %s%s into %s, once", ds.name, url, size, cache)
            step, next_report = max(total or 0, 1 << 28) // 10, 0
            for chunk in iter(lambda: response.read(1 << 20), b""):
                out.write(chunk)
                digest.update(chunk)
                got += len(chunk)
                if got >= next_report + step:
                    next_report = got
                    log.info(
                        "data=%s: %.0f MB%s downloaded", ds.name, got / 1e6, f" of {total / 1e6:.0f}" if total else ""
                    )
    except urllib.error.HTTPError as e:
        raise ConfigError(offline_help(ds, cache, url, f"HTTP {e.code} {e.reason}")) from None
    except urllib.error.URLError as e:
        raise ConfigError(offline_help(ds, cache, url, str(e.reason))) from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise ConfigError(
            offline_help(ds, cache, url, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        ) from None
    if total is not None and got != total:
        raise ConfigError(offline_help(ds, cache, url, f"the connection ended after {got} of {total} bytes"))
    return digest.hexdigest()


def _extract(ds: Standard, archive: str, into: str, source: str) -> None:
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # no paths outside `into`, no device files
    try:
        with tarfile.open(archive, "r:*") as tar:
            if not safe:
                for member in tar.getmembers():
                    if member.name.startswith("/") or ".." in Path(member.name).parts:
                        raise tarfile.TarError(f"{member.name} points outside the archive's folder")
            tar.extractall(into, **safe)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        said = (str(e).splitlines() or [""])[0].rstrip(": ")  # tarfile lists each method it tried on lines of their own
        raise ConfigError(
            f"data={ds.name}: the archive from {source} cannot be extracted ({type(e).__name__}: {said}): it is truncated or "
            f"not {ds.filename}. Nothing was kept. Run again to download it anew, or replace it with a whole copy."
        ) from None


# ---------------------------------------------------------------------------------------------
# CIFAR-10: torchvision's loader of the pickled batches.


def build_cifar10(folder: str, image_size: int, augment, keep_uint8: bool) -> tuple:
    """(train set: the five batches, val set: test_batch, class names from batches.meta)."""
    sets = []
    for train in (True, False):
        try:
            sets.append(cifar_images(folder, train, transforms_for(image_size, train, augment, keep_uint8)))
        except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError, AttributeError, OSError) as e:
            files = "data_batch_1 ... data_batch_5" if train else "test_batch"
            raise ConfigError(
                f"data=cifar10: {folder}'s {files} (or batches.meta) cannot be read as CIFAR-10's pickled batches "
                f"({type(e).__name__}: {e}): a file is truncated, corrupt or of another dataset. Replace the folder's files "
                "with those of a whole cifar-10-python.tar.gz (or, for the trainer's own download, delete the folder and run again)."
            ) from None
    return sets[0], sets[1], list(sets[0].classes)


class CifarImages(CIFAR10):
    """torchvision's CIFAR10 (its loading of the pickled batches), read from ``folder``, with two changes.

    Files are checked for presence, not for their MD5: torchvision hashes every batch file each time
    the set is opened; here the archive's MD5 is checked once, at download, and a user's own files
    are read as they are (a truncated or foreign file fails to unpickle, with a message). The
    re-hash at every start bought nothing, and the MD5s would refuse the small files in the real
    format that the tests write.

    A sample is a uint8 CxHxW tensor, not a PIL image: the trainer's transforms take both, and
    the tensor is a view of the array, with no copy into PIL.
    """

    def __init__(self, folder: str, train: bool, transform=None) -> None:
        self.base_folder = os.path.basename(os.path.normpath(folder))  # a folder of any name
        super().__init__(os.path.dirname(os.path.normpath(folder)), train=train, transform=transform)
        self.targets = [int(t) for t in self.targets]

    def _check_integrity(self) -> bool:
        return _cifar_problem(os.path.join(self.root, self.base_folder)) is None

    def _load_meta(self) -> None:
        with open(os.path.join(self.root, self.base_folder, self.meta["filename"]), "rb") as f:
            self.classes = list(pickle.load(f, encoding="latin1")[self.meta["key"]])
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def __getitem__(self, index: int):
        image = torch.from_numpy(self.data[index]).permute(2, 0, 1)
        return (self.transform(image) if self.transform is not None else image), self.targets[index]


def cifar_images(folder: str, train: bool, transform=None):
    """torchvision's CIFAR10 reading ``folder`` (``CifarImages``): the five training batches, or test_batch."""
    return CifarImages(folder, train, transform)
