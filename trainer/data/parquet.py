"""``data=parquet``: images stored as encoded bytes in Parquet files, read with pyarrow one row group at a time.

The layout public image datasets publish in (Hugging Face's parquet exports): a column ``image``
holding the encoded file (binary, or a struct with a ``bytes`` field) and an integer ``label``;
class names from the ``huggingface`` schema metadata when present. Files may sit in ``train/`` and
``val/`` folders or be named ``train-*.parquet`` / ``validation-*.parquet``; ``python -m trainer.pack
SRC DST --format parquet`` writes them. ``data.root`` may be a folder or an fsspec URL: pyarrow
reads the footer, then each row group with ranged reads, so only the row groups a process needs
are fetched.

A row group is the unit of reading: ``shards.BlockImages`` keeps a process's current row groups in
memory and ``shards.BlockSampler`` gives each rank and loader worker its own row groups, shuffled
across files and row groups.
"""

from __future__ import annotations

import json
import os
from typing import List, Optional, Tuple

from trainer.data.decoders import Loader
from trainer.data.folder import decode_min_side, transforms_for
from trainer.data.shards import BlockImages, find_split_files, require_root, split_blocks
from trainer.data.storage import explain, open_root
from trainer.errors import ConfigError

IMAGE_COLUMNS = ("image", "img", "jpg", "png")
LABEL_COLUMNS = ("label", "labels", "cls", "class")
OPEN_FILES = 8  # Parquet files a process keeps open (their footers parsed)


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "data=parquet needs pyarrow: pip install pyarrow (or pip install 'trainer-switchboard[data]')."
        ) from None
    return pq


class RowGroups:
    """Picklable reader of (file, row group) blocks -> [(encoded bytes, label)]; files opened once per process."""

    def __init__(self, fs, files: List[str], blocks: List[Tuple[int, int]], image: str, label: str) -> None:
        self.fs, self.files, self.blocks, self.image, self.label = fs, files, blocks, image, label
        self._open, self._pid = {}, os.getpid()

    def __getstate__(self):
        return dict(self.__dict__, _open={})

    def _file(self, f: int):
        if self._pid != os.getpid():  # a forked loader worker: an inherited handle shares its offset with the parent
            self._open, self._pid = {}, os.getpid()
        entry = self._open.pop(f, None)
        if entry is None:
            # no read-ahead cache (s3fs's default fetches 50 MiB past each read and keeps it): pyarrow
            # asks for the footer, then each row group's column chunks, coalesced by pre_buffer
            handle = self.fs.open(self.files[f], "rb", cache_type="none")
            entry = (_pyarrow().ParquetFile(handle, pre_buffer=True), handle)
        self._open[f] = entry  # most recently used last
        while len(self._open) > OPEN_FILES:
            self._open.pop(next(iter(self._open)))[1].close()
        pf = entry[0]
        return pf

    def where(self, block: int) -> str:
        f, rg = self.blocks[block]
        return f"{self.files[f]}, row group {rg}"

    def __call__(self, block: int):
        f, rg = self.blocks[block]
        try:
            table = self._file(f).read_row_group(rg, columns=[self.image, self.label])
        except Exception as e:  # noqa: BLE001 - the store's errors and pyarrow's, named with the file
            raise explain(e, self.where(block), "data.root") from None
        images = table.column(self.image).combine_chunks()
        if hasattr(images.type, "get_field_index") and images.type.get_field_index("bytes") >= 0:
            images = images.field("bytes")
        return list(zip(images.to_pylist(), table.column(self.label).to_pylist()))


def _index(fs, files: List[str], root: str):
    """(blocks, sizes, image column, label column, class names or None) of a list of Parquet files."""
    pq = _pyarrow()
    blocks, sizes, columns, names = [], [], None, None
    for i, path in enumerate(files):
        try:
            with fs.open(path, "rb") as f:
                meta = pq.ParquetFile(f).metadata
                schema = pq.ParquetFile(f).schema_arrow
        except Exception as e:  # noqa: BLE001 - pyarrow's ArrowInvalid and the storage's errors
            raise ConfigError(
                f"'data.root' ({root}): {path} is not a readable Parquet file ({type(e).__name__}: {e})."
            ) from None
        fields = set(schema.names)
        image = next((c for c in IMAGE_COLUMNS if c in fields), None)
        label = next((c for c in LABEL_COLUMNS if c in fields), None)
        if image is None or label is None:
            raise ConfigError(
                f"'data.root' ({root}): {path} has columns {sorted(fields)}; data=parquet needs an image column "
                f"({' or '.join(IMAGE_COLUMNS)}: encoded bytes) and a label column ({' or '.join(LABEL_COLUMNS)}: integers)."
            )
        if columns is None:
            columns = (image, label)
        if names is None and schema.metadata and b"huggingface" in schema.metadata:
            try:
                names = json.loads(schema.metadata[b"huggingface"])["info"]["features"][label]["names"]
            except (KeyError, TypeError, ValueError):
                names = None
        for rg in range(meta.num_row_groups):
            if meta.row_group(rg).num_rows:
                blocks.append((i, rg))
                sizes.append(meta.row_group(rg).num_rows)
    return blocks, sizes, columns, names


def _label_classes(fs, paths, label_column: str) -> list:
    """No class names stored: the labels are the classes, 0..max (only the label column is read)."""
    pq = _pyarrow()
    import pyarrow as pa  # lazy, as in _pyarrow

    top = -1
    for path in paths:
        with fs.open(path, "rb") as f:
            column = pq.read_table(f, columns=[label_column]).column(0)
        if not (pa.types.is_integer(column.type) or pa.types.is_null(column.type)):
            raise ConfigError(
                f"{path}: its label column '{label_column}' holds {column.type} values; data=parquet reads class numbers "
                "(integers 0, 1, ...) there, with the class names in the file's metadata if any (python -m trainer.pack "
                "writes both)."
            )
        top = max(top, max((v for v in column.to_pylist() if v is not None), default=-1))
    return [str(i) for i in range(top + 1)]


def build_parquet(
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
    require_root(root, "parquet", "Parquet files")
    fs, base = open_root(root, storage_options)
    splits = find_split_files(fs, base, ".parquet")
    if not splits["train"]:
        raise ConfigError(
            f"'data.root' ({root}) holds no .parquet files. Make them with: python -m trainer.pack SRC DST --format parquet"
        )
    blocks, sizes, columns, names = _index(fs, splits["train"], root)
    if not blocks:
        raise ConfigError(f"'data.root' ({root}): its Parquet files hold no rows.")
    decode = Loader(decoder, min_side=decode_min_side(decode_scale, image_size, augment, keep_uint8)).decode
    reader = RowGroups(fs, splits["train"], blocks, *columns)
    if names is None:
        names = _label_classes(fs, splits["train"], columns[1])

    def dataset(reader, sizes, train):
        transform = transforms_for(image_size, train, augment, keep_uint8)
        return BlockImages.from_reader(reader, sizes, names, transform, decode, on_bad_sample, window)

    if splits["val"]:
        v_blocks, v_sizes, v_columns, _ = _index(fs, splits["val"], root)
        return (
            dataset(reader, sizes, True),
            dataset(RowGroups(fs, splits["val"], v_blocks, *v_columns), v_sizes, False),
            names,
        )
    train_b, val_b = split_blocks(sizes, val_split, seed)
    train = dataset(
        RowGroups(fs, splits["train"], [blocks[b] for b in train_b], *columns), [sizes[b] for b in train_b], True
    )
    val = (
        dataset(RowGroups(fs, splits["train"], [blocks[b] for b in val_b], *columns), [sizes[b] for b in val_b], False)
        if val_b
        else None
    )
    return train, val, names
