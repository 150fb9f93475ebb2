"""``data=webdataset``: streaming tar shards in the WebDataset layout, for datasets bigger than local disk.

A shard is a plain tar of samples grouped by key: ``000123.jpg`` (or .png/.webp) and ``000123.cls``
(the label as text). ``python -m trainer.pack SRC DST --format webdataset`` writes them with
WebDataset's own ``TarWriter``, plus ``train.json`` / ``val.json`` in the ``wids`` index format
(shard list with sample counts), so the dataset's length is known without reading a shard and
WebDataset's own ``wids.ShardListDataset`` opens the same files.

Why not WebDataset's loaders: its iterable pipeline splits shards, not samples, across ranks
(unequal batches per rank hang DDP unless epochs are cut or padded by hand) and has no mid-epoch
resume; its indexed reader ``wids`` fetches S3 shards by running ``aws s3 cp``, downloads into the
final name (a killed download is later read as a whole shard), and never deletes what it
downloaded. Here a shard is fetched whole through fsspec (one sequential GET, what object stores
are fastest at), held in memory while its samples are read, then dropped: nothing is written to
local disk, so the dataset can be any size. ``shards.BlockSampler`` gives each rank and loader
worker its own shards and makes the epoch exact and resumable. ``data.cache=DIR`` copies the shards
to local disk instead, when they fit.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from typing import List, Optional, Tuple

from torchvision.datasets.folder import IMG_EXTENSIONS  # what an image folder (and so trainer.pack) takes

from trainer.data.decoders import Loader
from trainer.data.folder import decode_min_side, transforms_for
from trainer.data.layout import TRAIN_SPLIT, find_val_split
from trainer.data.shards import BlockImages, find_split_files, require_root, split_blocks
from trainer.data.storage import explain, open_root
from trainer.errors import ConfigError

log = logging.getLogger(__name__)


def _image_extensions():
    return tuple(e.lstrip(".") for e in IMG_EXTENSIONS)


IMAGE_EXTENSIONS = _image_extensions()


def read_shard(data: bytes, where: str) -> List[Tuple[bytes, int]]:
    """A WebDataset tar's bytes -> [(encoded image, label)] in the order the samples are stored."""
    samples = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                if "." not in base:
                    continue
                key = member.name[: len(member.name) - len(base)] + base.split(".", 1)[0]
                samples.setdefault(key, {})[base.split(".", 1)[1].lower()] = tar.extractfile(member).read()
    except tarfile.TarError as e:
        raise ConfigError(f"{where} is not a readable tar shard ({e}).") from None
    out = []
    for key, parts in samples.items():
        image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
        if image is None or "cls" not in parts:
            raise ConfigError(
                f"{where}: sample '{key}' has {sorted(parts)}; data=webdataset needs an image (.jpg, .png, ...) and a .cls label per sample."
            )
        label = parts["cls"].decode(errors="replace").strip()
        if not label.isdigit():
            raise ConfigError(
                f"{where}: sample '{key}' has the label {label[:40]!r} in its .cls; data=webdataset reads class numbers "
                "(0, 1, ...). Write each sample's class index there (python -m trainer.pack does)."
            )
        out.append((image, int(label)))
    return out


class TarShards:
    """Picklable reader of tar shards (one block each) through fsspec: a whole-object read per shard."""

    def __init__(self, fs, urls: List[str]) -> None:
        self.fs, self.urls = fs, urls

    def where(self, block: int) -> str:
        return self.urls[block]

    def __call__(self, block: int):
        try:
            data = self.fs.cat_file(self.urls[block])
        except Exception as e:  # noqa: BLE001 - a shard the index lists but the store cannot give
            raise explain(e, self.urls[block], "data.root") from None
        return read_shard(data, self.urls[block])


def _descriptor(fs, path: str, root: str):
    """(urls, sizes, classes or None) from a wids index JSON."""
    try:
        spec = json.loads(fs.cat_file(path))
        shards = spec["shardlist"]
        base = path.rsplit("/", 1)[0]
        urls = [s["url"] if "://" in s["url"] or s["url"].startswith("/") else f"{base}/{s['url']}" for s in shards]
        return urls, [int(s["nsamples"]) for s in shards], spec.get("classes")
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f'\'data.root\' ({root}): {path} is not a wids shard index ({type(e).__name__}: {e}); expected {{"shardlist": [{{"url": ..., "nsamples": ...}}]}}.'
        ) from None


def _counted_shards(fs, base: str, root: str) -> dict:
    """No train.json index: split -> (shard urls, samples per shard), each shard read once to count."""
    splits = {}
    found = find_split_files(fs, base, ".tar")
    if not found["train"]:
        raise ConfigError(
            f"'data.root' ({root}) holds no .tar shards and no train.json index. Make them with: python -m trainer.pack SRC DST --format webdataset"
        )
    log.info("data=webdataset: no train.json index in %s; reading every shard once to count its samples", root)
    for split, urls in found.items():
        if urls:
            splits[split] = (urls, [len(TarShards(fs, urls)(b)) for b in range(len(urls))])
    return splits


def build_webdataset(
    root: str,
    image_size: int,
    augment,
    val_split: float,
    seed: int,
    keep_uint8: bool,
    decoder: str,
    on_bad_sample: str,
    window: int,
    storage_options=None,
    decode_scale: str = "off",
) -> Tuple[BlockImages, Optional[BlockImages], list]:
    require_root(root, "webdataset", "tar shards")
    fs, base = open_root(root, storage_options)
    splits, classes = {}, None
    train_index = f"{base}/{TRAIN_SPLIT}.json"
    indexes = {  # each split's wids index, under the image folder's split names (layout)
        "train": train_index if fs.isfile(train_index) else None,
        "val": find_val_split(f"{base}/{{}}.json", fs.isfile),
    }
    for split, index in indexes.items():
        if index:
            urls, sizes, names = _descriptor(fs, index, root)
            splits[split] = (urls, sizes)
            classes = classes or names
    if "train" not in splits:  # no index: count the samples by reading each shard once
        splits.update(_counted_shards(fs, base, root))
    decode = Loader(decoder, min_side=decode_min_side(decode_scale, image_size, augment, keep_uint8)).decode
    if not sum(splits["train"][1]):
        raise ConfigError(f"'data.root' ({root}): its training shards hold no samples.")
    if classes is None:
        urls = splits["train"][0]
        labels = [lab for b in range(len(urls)) for _, lab in TarShards(fs, urls)(b)]
        classes = [str(i) for i in range(max(labels) + 1)]

    def dataset(urls, sizes, train):
        transform = transforms_for(image_size, train, augment, keep_uint8)
        return BlockImages.from_reader(TarShards(fs, urls), sizes, classes, transform, decode, on_bad_sample, window)

    urls, sizes = splits["train"]
    if "val" in splits:
        return dataset(urls, sizes, True), dataset(*splits["val"], False), classes
    train_b, val_b = split_blocks(sizes, val_split, seed)
    val = dataset([urls[b] for b in val_b], [sizes[b] for b in val_b], False) if val_b else None
    return dataset([urls[b] for b in train_b], [sizes[b] for b in train_b], True), val, classes
