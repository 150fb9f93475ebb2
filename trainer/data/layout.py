"""The folder layout every format reads the same way: which folders are splits, which are classes.

An image folder (``data=imagefolder``), its local copy (``data.cache``) and what ``python -m
trainer.pack`` makes of it (``data=packed``, ``parquet``, ``webdataset``) must agree on the classes
and the split, or a switch that should change only speed changes what the model sees. So the rules
live here once, and every lister calls them:

- ``split_folders``: ``DIR/train/<class>/...`` is the split layout only where ``train/`` holds class
  folders; a ``train/`` of images is a class called "train" (PASCAL VOC and COCO have one). The
  held-out split is ``val/`` or ``validation/`` (``VAL_SPLITS``, the names Parquet exports use too).
- ``is_class_folder``: hidden folders (``.cache``, ``.ipynb_checkpoints``, macOS's ``__MACOSX``) are
  never classes. Tools leave them beside the class folders; read as a class, one adds a label and
  shifts the labels of the classes sorted after it. Every lister skips them (and says so), rather
  than refusing the folder: they are common, and skipping them everywhere keeps every format's
  class list the same.
- ``walk``: a folder's tree as ImageFolder walks it, following symlinked folders, a loop refused.

No torch here: ``python -m trainer.pack`` imports it at start-up.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Iterable, List, Optional, Tuple

from trainer.errors import ConfigError

log = logging.getLogger(__name__)

TRAIN_SPLIT = "train"
VAL_SPLITS = ("val", "validation")  # the held-out split's folder (or file name prefix); the first found is read


def is_class_folder(name: str) -> bool:
    """Not a hidden folder: a dot-folder (``.cache``, ``.ipynb_checkpoints``) or ``__MACOSX`` (a Mac's zip)."""
    return not name.startswith(".") and name != "__MACOSX"


def class_folders(names: Iterable[str], where: str = "") -> List[str]:
    """The sorted class names among folder ``names``; a hidden one is skipped, with a warning where
    ``where`` names the folder they are in (the lister that checks a tree passes it)."""
    names = sorted(names)
    hidden = [n for n in names if not is_class_folder(n)]
    if hidden and where:
        log.warning("%s: skipping %s: hidden folders are never classes", where, ", ".join(hidden))
    return [n for n in names if is_class_folder(n)]


def find_class_folders(directory: str, warn: bool = False):
    """torchvision's ``find_classes`` with hidden folders skipped: (classes, class -> index)."""
    classes = class_folders((e.name for e in os.scandir(directory) if e.is_dir()), directory if warn else "")
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {c: i for i, c in enumerate(classes)}


def _subfolders(path: str, fs) -> List[str]:
    if fs is None:
        return [e.name for e in os.scandir(path) if e.is_dir()]
    return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(path, detail=True) if e["type"] == "directory"]


def find_val_split(path_of: str, exists: Callable[[str], bool]) -> Optional[str]:
    """The held-out split's path, ``path_of`` formatted with the first of ``VAL_SPLITS`` for which
    ``exists`` holds (a folder ``"DIR/{}"``, an index file ``"DIR/{}.json"``); None where none does."""
    return next((path_of.format(name) for name in VAL_SPLITS if exists(path_of.format(name))), None)


def split_folders(root: str, fs=None) -> Optional[Tuple[str, Optional[str]]]:
    """(train folder, val folder or None) where ``root`` holds ``train/<class>/...``; None where ``root``
    is the class folders themselves. ``fs``: an fsspec filesystem for a URL's path, None for local."""
    isdir = os.path.isdir if fs is None else fs.isdir
    train = f"{root.rstrip('/')}/{TRAIN_SPLIT}"
    if not isdir(train) or not any(is_class_folder(n) for n in _subfolders(train, fs)):
        return None
    return train, find_val_split(f"{root.rstrip('/')}/{{}}", isdir)


def walk(path: str, key: str):
    """``os.walk(path, followlinks=True)``, ImageFolder's walk, with a symlink loop refused: a link to a
    folder the walk is already inside would repeat the same images without end.

    The guard keeps the real paths of the folders the walk went through to reach ``top``, so a loop
    made of two links (``a/x`` -> ``b``, ``b/y`` -> ``a``) is caught too."""
    inside = {os.path.abspath(path): {os.path.realpath(path)}}
    for top, dirs, files in os.walk(path, followlinks=True):
        chain = inside.pop(os.path.abspath(top), {os.path.realpath(top)})
        for d in dirs:
            sub = os.path.join(top, d)
            target = os.path.realpath(sub)
            if target in chain:
                raise ConfigError(
                    f"'{key}': {sub} points back to {target}, a folder it is inside: a symlink loop, which would repeat the same "
                    "images without end. Remove the link or point it outside the data root."
                )
            inside[os.path.abspath(sub)] = chain | {target}
        yield top, dirs, files
