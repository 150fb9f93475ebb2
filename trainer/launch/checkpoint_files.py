"""The checkpoint files: written so a crash cannot leave a broken one, read so a bad one cannot run code.

- ``AtomicCheckpointIO``: every checkpoint is written to a temp file in the same dir, fsynced, then
  renamed over the target (and the dir fsynced). Lightning's own save goes through an fsspec
  transaction that renames but never fsyncs, so after a power loss or a full disk the renamed
  file can be empty; here a failed save leaves the previous file untouched and says so.
- ``safe_load`` loads with ``weights_only=True`` (only tensors and plain containers, plus the few
  types our checkpoints carry), so a checkpoint with a pickled payload is refused before any of its
  code can run; a truncated or corrupt file gives a clear error naming it.
- ``resolve_ckpt_path``: ``ckpt_path=last`` finds the newest checkpoint of the run dir that loads,
  falling back past corrupt ones.
"""

from __future__ import annotations

import errno
import logging
import os
import pathlib
import pickle
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode

from trainer.errors import ConfigError

log = logging.getLogger(__name__)


class CheckpointSaveError(RuntimeError):
    pass


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except BaseException as e:
            if os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(e, OSError):
                what = "the disk is full" if e.errno == errno.ENOSPC else str(e)
                raise CheckpointSaveError(
                    f"could not save checkpoint {path}: {what}. The previous checkpoint there (if any) is intact."
                ) from e
            raise

    def load_checkpoint(
        self, path, map_location: Optional[Any] = None, weights_only: Optional[bool] = None
    ) -> Dict[str, Any]:
        return safe_load(path, map_location=map_location)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _allow_our_types() -> None:
    """Types our checkpoints carry besides tensors and containers, allow-listed for weights_only."""
    allowed = [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, pathlib.PosixPath]
    try:
        allowed += [np.core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype("uint32"))]
    except Exception:
        pass
    torch.serialization.add_safe_globals(allowed)


def safe_load(path, map_location: Optional[Any] = "cpu", mmap: bool = False) -> Dict[str, Any]:
    """Load a checkpoint with weights_only semantics; ConfigError with a clear message if refused.

    ``mmap``: map the file instead of reading it (a look at its keys and shapes costs no read of
    the tensors); a file of torch's legacy format cannot be mapped and is read whole."""
    _allow_our_types()
    path = str(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, ".metadata")):
        return {}  # a distributed (sharded) checkpoint folder: the strategy loads it shard by shard
    if os.path.isdir(path):
        raise ConfigError(
            f"'ckpt_path' points at the folder {path}; it takes a checkpoint file (e.g. {os.path.join(path, 'last.ckpt')}), "
            "or ckpt_path=last to resume the run dir's newest checkpoint."
        )
    if not os.path.isfile(path):
        raise ConfigError(
            f"'ckpt_path' points at {path}, which does not exist. Use ckpt_path=last to resume the run dir's newest checkpoint."
        )
    try:
        if mmap:
            try:
                return torch.load(path, map_location=map_location, weights_only=True, mmap=True)
            except RuntimeError:
                pass  # not torch's zip format: read whole below
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" not in str(e):  # torch names the blocked global ("unsupported GLOBAL posix.system ...")
            raise ConfigError(
                f"Checkpoint {path} is not a readable checkpoint: it is truncated, corrupt or another kind of file ({_weights_only_reason(e)})."
            ) from None
        raise ConfigError(
            f"Refused to load checkpoint {path}: it contains objects that are not plain tensors or containers "
            f"({_weights_only_reason(e)}). Loading it would run code stored in the file; nothing was loaded or run. "
            "Only load checkpoints you trust; this trainer's own checkpoints load without this error."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise ConfigError(
            f"Checkpoint {path} is truncated or corrupt and cannot be loaded ({_weights_only_reason(e)})."
        ) from None


def _weights_only_reason(e: Exception) -> str:
    """The useful line of torch's long weights_only error (e.g. 'unsupported GLOBAL posix.system ...')."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    for line in lines:
        if "GLOBAL" in line or line.startswith("Unsupported") or "invalid load key" in line:
            return line[:200]
    return lines[0][:200] if lines else type(e).__name__


def checkpoint_candidates(run_dir: str) -> List[Path]:
    """The run dir's checkpoints, newest first (last.ckpt before others written at the same time)."""
    directory = Path(run_dir) / "checkpoints"
    if not directory.is_dir():
        return []
    files = [p for p in directory.glob("*.ckpt") if not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name == "last.ckpt"), reverse=True)


def resolve_ckpt_path(ckpt_path: Optional[str], run_dir: str) -> Optional[str]:
    """``last`` -> the newest checkpoint of ``run_dir`` that loads; a path -> checked; None -> None."""
    if not ckpt_path:
        return None
    if ckpt_path != "last":
        safe_load(ckpt_path)
        return ckpt_path
    candidates = checkpoint_candidates(run_dir)
    if not candidates:
        raise ConfigError(
            f"'ckpt_path=last' found no checkpoint in {Path(run_dir) / 'checkpoints'}. Point hydra.run.dir at the run "
            "to resume (the dir that holds checkpoints/), or pass ckpt_path=/path/to/file.ckpt."
        )
    problems = []
    for path in candidates:
        try:
            safe_load(path)
        except ConfigError as e:
            problems.append(str(e))
            log.warning("skipping %s: %s", path, e)
            continue
        if problems:
            log.warning("ckpt_path=last: fell back to %s (newer checkpoints could not be loaded)", path)
        return str(path)
    raise ConfigError("'ckpt_path=last': no checkpoint in the run dir could be loaded. " + " ".join(problems))
