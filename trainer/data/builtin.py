"""The built-in real-JPEG dataset: real photos, real decode cost, no download.

scikit-image ships a handful of photographs inside its wheel. We cut random crops out of ten of
them (random box, flip, brightness), store each crop as a JPEG, and the task is to tell which
photo a crop came from. It exercises exactly the path real datasets take (file read, JPEG decode,
resize, augment) and is learnable, so accuracy numbers mean something. The folder is generated
once into a cache dir (atomically: written to a temp dir, then renamed) and reused.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import multiprocessing
import os
import random
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from PIL import Image, ImageEnhance

from trainer.errors import ConfigError
from trainer.measure import hardware
from trainer.paths import default_cache_dir

log = logging.getLogger(__name__)

# file name in skimage/data -> class name
SOURCES = {
    "astronaut.png": "astronaut",
    "chelsea.png": "cat",
    "coffee.png": "coffee",
    "rocket.jpg": "rocket",
    "hubble_deep_field.jpg": "galaxies",
    "retina.jpg": "retina",
    "motorcycle_left.png": "motorcycle",
    "brick.png": "brick",
    "grass.png": "grass",
    "coins.png": "coins",
}
VERSION = 1


def skimage_data_dir() -> str:
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "data=builtin needs the scikit-image package, whose wheel carries the photos the built-in dataset is cut "
            "from: pip install scikit-image (it is a dependency of this project; reinstall with pip install -e .)."
        )
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


def ensure_builtin(cache_dir: str | None, images_per_class: int, stored_size: int, seed: int = 0) -> str:
    """Generate the dataset if missing; return its root (with train/ and val/ inside)."""
    cache_dir = os.path.expanduser(cache_dir or default_cache_dir())
    root = os.path.join(cache_dir, f"builtin-jpeg-v{VERSION}-{images_per_class}x{stored_size}-s{seed}")
    if os.path.isfile(os.path.join(root, "DONE")):
        return root
    try:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".builtin-", dir=cache_dir)
    except OSError as e:
        raise ConfigError(
            f"data=builtin: the trainer's cache {cache_dir} cannot be written ({e.strerror or e}), so the built-in images "
            "cannot be made there. Point data.cache_dir (or $TRAINER_CACHE) at a writable folder."
        ) from None
    try:
        _generate(tmp, images_per_class, stored_size, seed)
        open(os.path.join(tmp, "DONE"), "w").close()
        try:
            os.rename(tmp, root)
        except OSError:  # another process finished first: use theirs
            if not os.path.isfile(os.path.join(root, "DONE")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


# from this many images on, the crops are cut and saved by one process per usable core
PARALLEL_FROM = 2000


def _plan(images_per_class: int, size: int, seed: int, data_dir: str) -> list:
    """Every crop's parameters, drawn in one sequence from ``seed``: (path parts, source, box, flip, brightness).

    Drawn here, before any image is cut, so that cutting them in several processes writes the same
    files as cutting them in order in one."""
    rng = random.Random(seed)
    n_val = max(2, images_per_class // 4)
    jobs = []
    for fname, cls in SOURCES.items():
        with Image.open(os.path.join(data_dir, fname)) as photo:
            w, h = photo.size
        for split, count in (("train", images_per_class), ("val", n_val)):
            for i in range(count):
                area = rng.uniform(0.08, 0.5) * w * h
                aspect = rng.uniform(3 / 4, 4 / 3)
                cw = min(w, int(round((area * aspect) ** 0.5)))
                ch = min(h, int(round((area / aspect) ** 0.5)))
                x0, y0 = rng.randint(0, w - cw), rng.randint(0, h - ch)
                flip = rng.random() < 0.5
                brightness = rng.uniform(0.7, 1.3)
                jobs.append((split, cls, i, fname, (x0, y0, x0 + cw, y0 + ch), flip, brightness))
    return jobs


_PHOTOS: dict = {}  # per process: source file -> its RGB image


def _cut(job, out: str, size: int, data_dir: str) -> None:
    split, cls, i, fname, box, flip, brightness = job
    if fname not in _PHOTOS:
        _PHOTOS[fname] = Image.open(os.path.join(data_dir, fname)).convert("RGB")
    crop = _PHOTOS[fname].crop(box).resize((size, size), Image.BILINEAR)
    if flip:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    crop = ImageEnhance.Brightness(crop).enhance(brightness)
    crop.save(os.path.join(out, split, cls, f"{cls}_{i:05d}.jpg"), quality=90)


def _cut_all(jobs: list, out: str, size: int, data_dir: str) -> None:
    for job in jobs:
        _cut(job, out, size, data_dir)


def _generate(out: str, images_per_class: int, size: int, seed: int) -> None:
    """Cut and save every crop (a large set in one process per usable core: same files either way)."""
    data_dir = skimage_data_dir()
    jobs = _plan(images_per_class, size, seed, data_dir)
    for split, cls in {(j[0], j[1]) for j in jobs}:
        os.makedirs(os.path.join(out, split, cls), exist_ok=True)
    processes = min(hardware.usable_cores(), 32)
    if len(jobs) < PARALLEL_FROM or processes < 2:
        _cut_all(jobs, out, size, data_dir)
        return
    chunks = [jobs[k::processes] for k in range(processes)]
    # an executor, not a Pool: a worker that cannot start (a __main__ that spawn cannot import, such
    # as code piped to python's stdin) breaks it with an error, where a Pool starts workers forever
    try:
        with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(functools.partial(_cut_all, out=out, size=size, data_dir=data_dir), chunks))
    except BrokenProcessPool as e:
        log.info("the built-in set is cut in this process: its worker processes could not start (%s)", e)
        _cut_all(jobs, out, size, data_dir)  # the same files
