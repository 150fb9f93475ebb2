"""Where ``data.root`` lives: a local folder or an fsspec URL (``s3://bucket/prefix``, ``gs://``, ``file://``).

One place turns a root into ``(filesystem, path)`` and turns what object stores raise (no
credentials, a missing bucket, an access key the server does not know, nothing at the prefix) into
the one-paragraph ``ConfigError`` naming ``data.root`` and what to do. S3's endpoint and
credentials come from the standard AWS environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) or a profile, which
s3fs/botocore read themselves; ``data.storage_options`` passes anything else to fsspec.

Filesystem objects are picklable (fsspec re-creates them from their arguments), and fsspec drops
its instance cache in a forked loader worker, so every worker opens its own connections.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Dict, Optional, Tuple

import fsspec
from omegaconf import DictConfig, OmegaConf

from trainer.errors import ConfigError

# what each protocol needs installed, for the message when it is missing
PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


def is_url(root: Optional[str]) -> bool:
    """An fsspec URL (``proto://...``), not a local path."""
    return bool(root) and "://" in str(root)


def is_remote(root: Optional[str]) -> bool:
    """A URL that is not on this machine's file system (``file://`` is local)."""
    return is_url(root) and not str(root).startswith(("file://", "local://"))


def local_path(root: str) -> str:
    """``file:///x`` -> ``/x``; a plain path is returned with ``~`` expanded."""
    for prefix in ("file://", "local://"):
        if str(root).startswith(prefix):
            return str(root)[len(prefix) :]
    return os.path.expanduser(str(root))


def plain_options(storage_options) -> Dict[str, Any]:
    """``data.storage_options`` as plain dicts all the way down (botocore does not take OmegaConf nodes)."""
    if isinstance(storage_options, DictConfig):
        return OmegaConf.to_container(storage_options, resolve=True)
    return dict(storage_options or {})


def open_root(root: str, storage_options: Optional[Dict[str, Any]] = None, key: str = "data.root") -> Tuple[Any, str]:
    """``root`` -> (fsspec filesystem, path inside it), checked to exist; a clear error otherwise."""
    protocol = str(root).split("://", 1)[0]
    options = plain_options(storage_options)
    try:
        fs, path = fsspec.core.url_to_fs(str(root), **options)
    except (ImportError, ValueError) as e:
        package = PACKAGES.get(protocol)
        if package and isinstance(e, ImportError):
            raise ConfigError(
                f"'{key}' ({root}) is a {protocol}:// URL, which needs the {package} package: pip install {package} "
                "(or pip install 'trainer-switchboard[s3]' for S3)."
            ) from None
        raise ConfigError(
            f"'{key}' ({root}): {protocol}:// is not a storage fsspec knows ({e}). Use a local folder or a URL such as s3://bucket/prefix."
        ) from None
    try:
        found = fs.exists(path) and (fs.isdir(path) or fs.isfile(path))
        if not found and is_remote(root):
            fs.ls(path.split("/", 1)[0])  # the bucket: its own error when it is missing (exists() says only False)
    except Exception as e:  # noqa: BLE001 - every storage raises its own; explain() names what to fix
        raise explain(_precise(fs, path, e), root, key) from None
    if not found:
        raise ConfigError(
            f"'{key}' ({root}) does not exist: nothing is stored at that path (check the bucket and the prefix; "
            "object stores are case-sensitive and have no empty folders)."
        )
    return ForkSafe(fs), path.rstrip("/")


class ForkSafe:
    """An fsspec filesystem that loader workers can use: re-created in a process that did not make it.

    Async filesystems (s3fs, gcsfs) run their I/O on an event-loop thread of the process that made
    them and refuse to work in a forked child ("not fork-safe"); DataLoader workers are forked
    copies that never unpickle the dataset. This wrapper notices the new PID and rebuilds the
    filesystem from its pickled arguments, so each worker has its own loop and connections.
    """

    def __init__(self, fs) -> None:
        self.__dict__.update(_fs=fs, _pid=os.getpid(), _blob=pickle.dumps(fs))

    def __getstate__(self):
        return {"_blob": self._blob}

    def __setstate__(self, state) -> None:
        self.__dict__.update(_fs=None, _pid=None, _blob=state["_blob"])

    @property
    def fs(self):
        if self._pid != os.getpid():
            self.__dict__.update(_fs=pickle.loads(self._blob), _pid=os.getpid())
        return self._fs

    def __getattr__(self, name):
        return getattr(self.fs, name)


def _precise(fs, path: str, error: BaseException) -> BaseException:
    """A HEAD request's error has no body (S3 says only "Forbidden"); a listing says why."""
    if isinstance(error, PermissionError) and str(error).strip() in ("Forbidden", "Access Denied"):
        try:
            fs.ls(path)
        except Exception as e:  # noqa: BLE001
            return e
    return error


def explain(error: BaseException, root: str, key: str = "data.root") -> ConfigError:
    """What an object store raised -> one paragraph: what is wrong and which setting fixes it."""
    name = type(error).__name__
    text = str(error)
    if (
        name in ("NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError")
        or "Unable to locate credentials" in text
    ):
        return ConfigError(
            f"'{key}' ({root}): no credentials for the object store. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
            "(and AWS_ENDPOINT_URL for a server other than AWS), or AWS_PROFILE; for a public bucket pass "
            "+data.storage_options.anon=true."
        )
    if any(
        s in text
        for s in (
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "InvalidClientTokenId",
            "does not exist in our records",
            "signature we calculated does not match",
        )
    ):
        return ConfigError(
            f"'{key}' ({root}): the object store refused the credentials ({_first_line(text)}). Check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for this endpoint."
        )
    if (
        "NoSuchBucket" in text
        or "bucket does not exist" in text.lower()
        or (isinstance(error, FileNotFoundError) and "bucket" in text.lower())
    ):
        bucket = str(root).split("://", 1)[-1].split("/", 1)[0]
        return ConfigError(
            f"'{key}' ({root}): the bucket '{bucket}' does not exist on this endpoint{_endpoint()}. Check the bucket name and AWS_ENDPOINT_URL."
        )
    if isinstance(error, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        return ConfigError(
            f"'{key}' ({root}): access denied by the object store ({_first_line(text)}). These credentials may not read this bucket."
        )
    if isinstance(error, (ConnectionError, TimeoutError, OSError)) and (
        "connect" in text.lower() or "timeout" in text.lower()
    ):
        return ConfigError(
            f"'{key}' ({root}): cannot reach the object store{_endpoint()} ({_first_line(text)}). Check AWS_ENDPOINT_URL and the network."
        )
    return ConfigError(f"'{key}' ({root}) cannot be read: {name}: {_first_line(text)}.")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else "no details"


def _endpoint() -> str:
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f" ({url})" if url else ""
