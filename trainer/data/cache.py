"""``data.cache=DIR``: copy a slow or remote dataset folder to fast local storage once, then read from there.

- checksummed: a manifest (relative path, size, sha256) is written with the copy; a file is trusted
  only if its size and hash match, so a torn copy is never read as data;
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
from pathlib import Path

from ..errors import ConfigError

log = logging.getLogger(__name__)

MARKER = ".trainer-cache"  # in every copy this cache made: only such folders are written into


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _ours(dst: Path) -> bool:
    """A folder this cache made (the marker; copies from before it have MANIFEST.json and DONE)."""
    return (dst / MARKER).exists() or ((dst / "MANIFEST.json").exists() and (dst / "DONE").exists())


def cached_copy(src: str, cache_dir: str) -> str:
    """Return the local copy of ``src`` under ``cache_dir`` (made on first use)."""
    src_path = Path(os.path.expanduser(src)).resolve()
    if not src_path.is_dir():
        raise ConfigError(f"'data.root' points at {src}, which does not exist or is not a folder; data.cache can only copy a folder.")
    name = f"{src_path.name}-{hashlib.sha1(str(src_path).encode()).hexdigest()[:8]}"
    root = Path(os.path.expanduser(cache_dir))
    dst, done = root / name, root / name / "DONE"
    if done.exists() and _ours(dst):
        return str(dst)
    try:
        root.mkdir(parents=True, exist_ok=True)
        # The lock lives beside the copy, not in it: every check of dst happens under it, so a rank
        # never sees another rank's half-made folder (made, marker not yet written) as foreign files.
        lock = open(root / f".{name}.lock", "a")
    except OSError as e:
        raise ConfigError(f"'data.cache={cache_dir}' cannot be created ({e.strerror}). Point it at a writable local folder.") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process copies; the others wait here
        if done.exists() and _ours(dst):
            return str(dst)
        if dst.is_dir() and any(dst.iterdir()) and not _ours(dst):
            raise ConfigError(
                f"'data.cache={cache_dir}': {dst} already exists and holds files this cache did not write; "
                "copying into it could overwrite them, so nothing was changed. Point data.cache at another folder."
            )
        try:
            dst.mkdir(exist_ok=True)
            (dst / MARKER).touch()
        except OSError as e:
            raise ConfigError(f"'data.cache={cache_dir}' cannot be written ({e.strerror}). Point it at a writable local folder.") from None
        _copy(src_path, dst)
        done.write_text(json.dumps({"source": str(src_path)}))
    return str(dst)  # the lock is released when its file closes


def _copy(src: Path, dst: Path) -> None:
    manifest_path = dst / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    copied = reused = 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = str(path.relative_to(src))
        target = dst / rel
        size = path.stat().st_size
        entry = manifest.get(rel)
        if entry and target.exists() and target.stat().st_size == size == entry["size"] and _sha256(target) == entry["sha256"]:
            reused += 1
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        shutil.copyfile(path, tmp)
        checksum = _sha256(tmp)
        if checksum != _sha256(path):
            raise ConfigError(f"data.cache: {path} changed while it was being copied; run again.")
        os.replace(tmp, target)
        manifest[rel] = {"size": size, "sha256": checksum}
        copied += 1
        if copied % 500 == 0:  # resumable: the manifest is saved as the copy goes
            manifest_path.write_text(json.dumps(manifest))
    manifest_path.write_text(json.dumps(manifest))
    log.info("data.cache: copied %d files (%d already there) from %s to %s", copied, reused, src, dst)
