"""What leaves the machine: **credentials never leave it** through a tracker (``redact``).

A config may hold them (``data.storage_options`` for fsspec, a tracking URI with ``user:pass@``, the
command line that set them). Masked as ``***`` in everything a tracker gets (params, run names, the
uploaded files, W&B's record of the command line; the CSV and TensorBoard loggers' params too): the
value of every key whose name says credential (a word ``secret``, ``password``, ``passwd``,
``passphrase``, ``token``, ``credential(s)``, ``auth``, ``authorization``, ``cookie``, ``signature``; a
last word ``key``, as in ``key``, ``api_key``, ``aws_secret_access_key``, ``account_key``;
``..._key_id``; ``connection_string``), at any depth (``data.storage_options.*``, ``logger.*``), also as
``key=value`` in an override or a query string; and the userinfo of every URL (``https://***@host``).
The run dir's own ``metrics.json`` and ``.hydra/config.yaml`` keep the values (the user's files, on the
user's machine): the trackers get redacted copies (``uploads_of``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional

import yaml

from trainer.measure import metrics as metrics_mod

REDACTED = "***"
# words of a key's name that say it holds a credential (anywhere in the name: ``client_secret``,
# ``aws_session_token``, ``credentials.user``), and those that do as the name's last word (``key``,
# ``api_key``, ``account_key``; not ``key_dim``)
_SECRET_WORDS = frozenset(
    "secret secrets password passwords passwd passphrase token credential credentials creds auth authorization "
    "bearer cookie signature sig".split()
)
_KEY_WORDS = frozenset("key keys apikey secretkey accesskey privatekey accountkey keyid".split())
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@?#'\"<>]+@")
_OVERRIDE = re.compile(r"([+~]{0,2}[A-Za-z_][\w.\-/]*)=(.*)", re.DOTALL)
_ASSIGNMENT = re.compile(r"([A-Za-z_][\w.\-/]*)=('[^']*'|\"[^\"]*\"|[^\s&'\"<>]*)")


def looks_secret(name: str) -> bool:
    """Whether a key's name (a dotted path too) says that its value is a credential."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name)).lower()) if w]
    if not words:
        return False
    return (
        bool(_SECRET_WORDS.intersection(words))
        or words[-1] in _KEY_WORDS
        or words[-2:]
        in (
            ["key", "id"],
            ["connection", "string"],
        )
    )


def _mask(value: Any) -> Any:
    """A credential's value: every leaf masked (None, booleans and empty strings say nothing and stay)."""
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(v) for v in value]
    return value if value is None or isinstance(value, bool) or value == "" else REDACTED


def redact(value: Any) -> Any:
    """A config, a metrics.json or a params dict with its credentials masked: the values under keys that
    look like one, ``user:pass@`` in URLs, and ``key=value`` (overrides, query strings) with such a key."""
    if isinstance(value, dict):
        return {k: _mask(v) if looks_secret(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """Free text (a URL, an override, a page): URL userinfo and ``key=value`` with a credential's key masked."""
    text = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    whole = _OVERRIDE.fullmatch(text)
    if whole and looks_secret(whole.group(1)):  # one override: everything after its '=' is the value
        return f"{whole.group(1)}={REDACTED}"
    return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}" if looks_secret(m.group(1)) else m.group(0), text)


def _redacted_text_of(path: str) -> Optional[str]:
    """The file's text with its credentials masked (JSON and YAML by structure); None for a binary file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        return None  # an image: nothing of the config in it
    try:
        if path.endswith(".json"):
            return json.dumps(redact(json.loads(text)), indent=2) + "\n"
        if path.endswith((".yaml", ".yml")):
            return yaml.safe_dump(redact(yaml.safe_load(text)), sort_keys=False, allow_unicode=True)
    except ValueError:  # yaml's errors are ValueErrors too
        pass
    return redact_text(text)


def uploads_of(files: List[str], base: str, dest: str) -> List[str]:
    """What a tracker gets of ``files``: a redacted copy in ``dest`` (same path relative to it as to
    ``base``) of each text file, the file itself for an image. The files in ``base`` stay as they are."""
    out = []
    for path in files:
        text = _redacted_text_of(path)
        if text is None:
            out.append(path)
            continue
        copy = os.path.join(dest, os.path.relpath(path, base))
        metrics_mod.atomic_write_text(copy, text)  # replaces a link there, never writes through it
        out.append(copy)
    return out


@contextmanager
def redacted_argv() -> Iterator[None]:
    """W&B records the command line in the run's metadata: it reads a copy with credentials masked."""
    saved = list(sys.argv)
    sys.argv[1:] = [redact_text(a) for a in saved[1:]]
    try:
        yield
    finally:
        sys.argv[:] = saved
