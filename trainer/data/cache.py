"""``data.cache=DIR``: copy a slow or remote dataset (a folder or an fsspec URL such as ``s3://bucket/prefix``)
to fast local storage once, then read from there.

- checksummed: a manifest (relative path, size, sha256, and the object's ETag for a URL) is written
  with the copy; a file is trusted only if its size and hash match (and its ETag is still the
  source's), so a torn copy is never read as data; each file is fetched to a ``.part`` name and
  renamed into place only when whole;
- resumable: files already present and matching are not copied again, so an interrupted copy
  continues where it stopped;
- safe under concurrent ranks: the checks and the copy run under an exclusive lock file beside the
  copy in DIR; one process copies, the others block on the lock and then find the finished copy
  (its DONE marker).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from trainer.data.layout import walk
from trainer.data.storage import explain, is_remote, local_path, open_root, plain_options
from trainer.errors import ConfigError

log = logging.getLogger(__name__)

MARKER = ".trainer-cache"  # in every copy this cache made: only such folders are written into


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _ours(dst: Path) -> bool:
    """A folder this cache made (the marker; copies from before it have MANIFEST.json and DONE)."""
    return (dst / MARKER).exists() or ((dst / "MANIFEST.json").exists() and (dst / "DONE").exists())


def _source_name(src: str, storage_options=None) -> tuple:
    """(display/identity string, folder name in the cache) for a local path or a URL.

    A URL's identity includes the endpoint (the same bucket name on two servers is two datasets).
    """
    if is_remote(src):
        options = plain_options(storage_options)
        endpoint = (
            options.get("endpoint_url")
            or (options.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        ident = src.rstrip("/") + (f" at {endpoint}" if endpoint else "")
        base = src.rstrip("/").rsplit("/", 1)[-1] or src.split("://", 1)[-1].split("/", 1)[0]
    else:
        ident = str(Path(local_path(src)).resolve())
        base = Path(ident).name
    return ident, f"{base}-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"


def cached_copy(src: str, cache_dir: str, storage_options=None) -> str:
    """Return the local copy of ``src`` (a folder or an fsspec URL) under ``cache_dir`` (made on first use)."""
    if not is_remote(src) and not Path(local_path(src)).is_dir():
        raise ConfigError(
            f"'data.root' points at {src}, which does not exist or is not a folder; data.cache can only copy a folder."
        )
    ident, name = _source_name(src, storage_options)
    root = Path(os.path.expanduser(cache_dir))
    if not is_remote(src):
        _refuse_overlap(Path(ident), root, cache_dir)
    dst, done = root / name, root / name / "DONE"
    if done.exists() and _ours(dst):
        return str(dst)
    try:
        root.mkdir(parents=True, exist_ok=True)
        # The lock lives beside the copy, not in it: every check of dst happens under it, so a rank
        # never sees another rank's half-made folder (made, marker not yet written) as foreign files.
        lock = open(root / f".{name}.lock", "a")
    except OSError as e:
        raise ConfigError(
            f"'data.cache={cache_dir}' cannot be created ({e.strerror}). Point it at a writable local folder."
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process copies; the others wait here
        if done.exists() and _ours(dst):
            return str(dst)
        if dst.is_dir() and any(dst.iterdir()) and not _ours(dst):
            raise ConfigError(
                f"'data.cache={cache_dir}': {dst} already exists and holds files this cache did not write; "
                "copying into it could overwrite them, so nothing was changed. Point data.cache at another folder."
            )
        source = (
            _RemoteSource(src, storage_options) if is_remote(src) else _LocalSource(Path(local_path(src)).resolve())
        )
        try:
            dst.mkdir(exist_ok=True)
            (dst / MARKER).touch()
        except OSError as e:
            raise ConfigError(
                f"'data.cache={cache_dir}' cannot be written ({e.strerror}). Point it at a writable local folder."
            ) from None
        _copy(source, dst)
        done.write_text(json.dumps({"source": ident}))
    return str(dst)  # the lock is released when its file closes


def _refuse_overlap(src: Path, root: Path, cache_dir: str) -> None:
    """A cache folder inside the source (or the source itself) writes the copy into the user's data: the
    copy copies itself, and a later run without data.cache reads it as one more class. A cache folder
    holding the source puts the user's data where a cache is deleted to free space. Refused before
    anything is written, as ``trainer.pack`` refuses a DST inside SRC."""
    cache = root.resolve()
    if cache == src or src in cache.parents:
        where = "is data.root itself" if cache == src else "is inside data.root"
        harm = "the copy would be written into the folder it copies (and a later run could read it as one more class)"
    elif cache in src.parents:
        where, harm = "holds data.root", "deleting the cache, to free space or fetch a new copy, would delete the data"
    else:
        return
    raise ConfigError(
        f"'data.cache={cache_dir}' {where} ({src}): {harm}. Nothing was written; point data.cache at a folder "
        "outside data.root, and data.root outside data.cache."
    )


class _LocalSource:
    """A local folder: files compared by size and sha256, also after the copy (a file changed mid-copy is refused)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def files(self):
        """rel -> (size, version): version None (local files are checked by content).

        Walked as ImageFolder walks it (``layout.walk``: into symlinked folders, a loop refused), so the
        copy holds every class the folder has: ``Path.rglob`` does not follow a symlinked class folder
        (Python 3.11), and the copy lost that class and shifted the labels after it."""
        found = {}
        for top, _, names in walk(str(self.path), "data.root"):
            for name in names:
                path = os.path.join(top, name)
                if os.path.isfile(path):  # not a broken link
                    found[os.path.relpath(path, self.path)] = (os.path.getsize(path), None)
        return dict(sorted(found.items()))

    def fetch(self, rels, tmps) -> list:
        """Copy; return the copies' sha256 (each also the source's after the copy)."""
        sums = []
        for rel, tmp in zip(rels, tmps):
            shutil.copyfile(self.path / rel, tmp)
            sums.append(_sha256(tmp))
            if sums[-1] != _sha256(self.path / rel):
                raise ConfigError(f"data.cache: {self.path / rel} changed while it was being copied; run again.")
        return sums


class _RemoteSource:
    """An object store prefix: files known by size and ETag; fetched many at a time (fsspec's batched get)."""

    def __init__(self, url: str, storage_options) -> None:
        self.url = url
        self.fs, self.path = open_root(url, storage_options)

    def files(self):
        try:
            listing = self.fs.find(self.path, detail=True)
        except Exception as e:  # noqa: BLE001
            raise explain(e, self.url) from None
        prefix = self.path.rstrip("/") + "/"
        return {
            name[len(prefix) :]: (
                int(info["size"]),
                str(info.get("ETag") or info.get("etag") or info.get("mtime") or ""),
            )
            for name, info in sorted(listing.items())
            if info.get("type") != "directory" and name.startswith(prefix)
        }

    def fetch(self, rels, tmps) -> list:
        try:
            self.fs.get([f"{self.path}/{rel}" for rel in rels], [str(t) for t in tmps])
        except Exception as e:  # noqa: BLE001
            raise explain(e, self.url) from None
        return [None] * len(rels)  # hashed by the caller


def _copy(source, dst: Path) -> None:
    manifest_path = dst / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    files = source.files()
    todo = []
    for rel, (size, version) in files.items():
        target = dst / rel
        entry = manifest.get(rel)
        if (
            entry
            and target.exists()
            and target.stat().st_size == size == entry["size"]
            and entry.get("version") == version
            and _sha256(target) == entry["sha256"]
        ):
            continue
        todo.append(rel)
    reused, copied, saved_at = len(files) - len(todo), 0, time.monotonic()
    for start in range(0, len(todo), 64):
        rels = todo[start : start + 64]
        tmps = []
        for rel in rels:
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            tmps.append(target.with_name(f".{target.name}.part"))
        sums = source.fetch(rels, tmps)
        for rel, tmp, checksum in zip(rels, tmps, sums):
            size, version = files[rel]
            if tmp.stat().st_size != size:  # a torn download is never moved into place
                raise ConfigError(
                    f"data.cache: {rel} arrived with {tmp.stat().st_size} bytes, not the {size} listed; it may have changed at the source. Run again."
                )
            manifest[rel] = {"size": size, "sha256": checksum or _sha256(tmp), "version": version}
            os.replace(tmp, dst / rel)
            copied += 1
        # resumable: the manifest is saved as the copy goes (after every batch while it is small, else every 2 s)
        if len(manifest) <= 5000 or time.monotonic() - saved_at > 2.0:
            _save(manifest_path, manifest)
            saved_at = time.monotonic()
    _save(manifest_path, manifest)
    log.info("data.cache: copied %d files (%d already there) to %s", copied, reused, dst)


def _save(path: Path, manifest: dict) -> None:
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_text(json.dumps(manifest))
    os.replace(tmp, path)  # a kill mid-write leaves the previous manifest, never a torn one
