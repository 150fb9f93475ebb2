"""data=parquet and data=webdataset: what trainer.pack writes, exact sharding across ranks x workers,
mid-epoch resume under DDP, and the same accuracy as the image folder they came from."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import read_metrics, run_cli

from trainer.data import ImageDataModule

BLOCK_FORMATS = ["parquet", "webdataset"]


@pytest.fixture(scope="module")
def packed(small_images, tmp_path_factory):
    """The small image folder (200 train, 50 val) as Parquet (row groups of 20) and WebDataset shards (of 30)."""
    from trainer.data.pack import pack

    out = tmp_path_factory.mktemp("packed")
    pack(small_images, str(out / "parquet"), fmt="parquet", shard_samples=80, group_rows=20)
    pack(small_images, str(out / "webdataset"), fmt="webdataset", shard_samples=30)
    pack(small_images, str(out / "packed"), 32)
    return {"parquet": str(out / "parquet"), "webdataset": str(out / "webdataset"), "packed": str(out / "packed")}


def test_pack_writes_the_layouts_other_tools_read(packed, small_images):
    import pyarrow.parquet as pq

    files = sorted(Path(packed["parquet"]).rglob("*.parquet"))
    assert [f.name for f in files] == [
        "train-00000-of-00003.parquet",
        "train-00001-of-00003.parquet",
        "train-00002-of-00003.parquet",
        "val-00000-of-00001.parquet",
    ]
    f = pq.ParquetFile(files[0])
    assert f.metadata.num_row_groups == 4 and f.metadata.row_group(0).num_rows == 20
    features = json.loads(f.schema_arrow.metadata[b"huggingface"])["info"][
        "features"
    ]  # Hugging Face's ClassLabel names
    assert features["label"]["names"] == sorted(p.name for p in Path(small_images, "train").iterdir())
    row = f.read_row_group(0).to_pylist()[0]
    source = Path(small_images) / row["image"]["path"]
    assert row["image"]["bytes"] == source.read_bytes()  # the encoded file, unchanged

    index = json.loads(Path(packed["webdataset"], "train.json").read_text())  # the wids index
    assert index["wids_version"] == 1 and sum(s["nsamples"] for s in index["shardlist"]) == 200
    import tarfile

    with tarfile.open(Path(packed["webdataset"], index["shardlist"][0]["url"])) as tar:
        names = tar.getnames()
    assert len(names) == 2 * 30 and sorted(names[:2]) == [
        "00000000.cls",
        "00000000.jpg",
    ]  # WebDataset's key.ext convention


def test_pack_refuses_size_for_encoded_formats(small_images, tmp_path):
    from trainer.data.pack import main

    assert main([small_images, str(tmp_path / "x"), "--format", "parquet", "--size", "32"]) == 2
    assert not (tmp_path / "x").exists()


def _ids(dataset):
    """Sample identity = hash of its encoded bytes (decode skipped)."""
    dataset.decode = lambda data: data
    dataset.transform = None
    return dataset


class _Tagged(torch.utils.data.Dataset):
    """(bytes hash, block, worker id) per sample, from a BlockImages whose decode is skipped."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        data, _ = self.blocks[i]
        info = torch.utils.data.get_worker_info()
        return hashlib.sha1(data).hexdigest(), self.blocks.locate(i)[0], info.id if info else -1


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_two_ranks_by_two_workers_read_every_sample_once_and_each_block_in_one_place(packed, compose, fmt):
    from trainer.data.shards import BlockSampler

    dm = ImageDataModule(compose(f"data={fmt}", f"data.root={packed[fmt]}", "data.batch_size=10").data)
    dm.build()
    dataset = _Tagged(_ids(dm.train_set))
    n = len(dataset)
    for epoch, window in ((0, 1), (1, 40)):
        seen, readers = [], {}
        for rank in (0, 1):
            sampler = BlockSampler(
                dm.train_set.sizes,
                seed=42,
                shuffle=True,
                batch_size=10,
                workers=2,
                window=window,
                num_replicas=2,
                rank=rank,
            )
            sampler.set_epoch(epoch)
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=10, sampler=sampler, num_workers=2, collate_fn=lambda b: b
            )
            batches = list(loader)
            assert len(batches) == n // 2 // 10  # equal batches on both ranks: DDP cannot hang on a short rank
            for batch in batches:
                for digest, block, worker in batch:
                    seen.append(digest)
                    readers.setdefault(block, set()).add((rank, worker))
        assert sorted(seen) == sorted(set(seen)) and len(seen) == n  # every sample once
        # each (rank, worker) reads a contiguous slice of the epoch's order, so only the blocks at the
        # 3 slice edges are read twice; shuffling across a window adds the blocks one window spans
        spanned = 0 if window == 1 else -(-window // min(dm.train_set.sizes)) + 1
        assert sum(len(r) for r in readers.values()) <= len(readers) + 3 * (1 + spanned), (window, readers)
        if window == 1:
            assert max(len(r) for r in readers.values()) <= 2, readers
    # the order is a function of (seed, epoch) and changes between epochs
    s = BlockSampler(dm.train_set.sizes, 42, True, 10, 2, 40, 1, 0)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first and sorted(list(s)) == sorted(first) == list(range(n))


def test_block_sampler_pads_unequal_ranks_and_skips_trained_batches():
    from trainer.data.shards import BlockSampler

    sizes = [7, 5, 9]  # 21 samples over 2 ranks: 11 each, one sample repeated
    a, b = (BlockSampler(sizes, 0, True, 4, 2, 8, 2, r) for r in (0, 1))
    assert len(a) == len(b) == 11 and sorted(set(list(a) + list(b))) == list(range(21))
    full = list(a)
    a.skip[0] = 8  # two batches trained before the checkpoint
    assert list(a) == full[8:]
    assert list(a) == full  # the skip applies once
    # batches go to workers in the DataLoader's round-robin order: worker w's runs are contiguous in the rank's slice
    s = BlockSampler([40], 0, False, 5, 2, 1, 1, 0)
    order = list(s)
    assert order[:5] == list(range(0, 5)) and order[5:10] == list(range(20, 25)) and order[10:15] == list(range(5, 10))


@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
def test_a_step_limit_reads_only_the_first_batches_of_the_epochs_blocks(packed, compose, fmt):
    """trainer.limit_train_batches / limit_val_batches (a number): the block sampler hands the loader's
    workers only the batches the epoch uses (the rest would be read and thrown away), the same first
    ones as without the limit, and a mid-epoch resume's skip still counts from the epoch's start."""
    from types import SimpleNamespace

    dm = ImageDataModule(compose(f"data={fmt}", f"data.root={packed[fmt]}", "data.batch_size=10").data)
    dm.build()
    dm.trainer = SimpleNamespace(limit_train_batches=1.0, limit_val_batches=1.0, world_size=1, global_rank=0)
    whole = list(dm.train_dataloader().sampler), list(dm.val_dataloader().sampler)
    dm.trainer.limit_train_batches, dm.trainer.limit_val_batches = 3, 2
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert len(train) == 3 and len(val) == 2
    assert list(train.sampler) == whole[0][:30] and list(val.sampler) == whole[1][:20]
    dm.load_state_dict({"position": [0, 1]})  # one batch of epoch 0 trained before the checkpoint
    assert list(dm.train_dataloader().sampler) == whole[0][10:30]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", BLOCK_FORMATS)
@pytest.mark.whole_machine  # two ranks: one core each
def test_ddp_two_ranks_two_workers_resumed_mid_epoch_ends_with_the_uninterrupted_weights(packed, tmp_path, fmt):
    args = [
        f"data={fmt}",
        f"data.root={packed[fmt]}",
        "data.augment=false",
        "data.image_size=16",
        "data.batch_size=10",
        "data.num_workers=2",
        "strategy=ddp",
        "devices=2",
        "trainer.max_epochs=2",
        "model.width=8",
        "monitor.enabled=false",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = run_cli(f"hydra.run.dir={straight}", *args, "checkpoint.every_n_steps=4", "checkpoint.keep_last_k=-1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # 200 samples, 2 ranks, batches of 10: 10 steps per epoch; step 12 is inside epoch 1
    mid = straight / "checkpoints" / "step0000012.ckpt"
    assert torch.load(mid, weights_only=False)["ImageDataModule"]["position"] == [1, 2]
    r = run_cli(f"hydra.run.dir={resumed}", *args, f"ckpt_path={mid}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run saw other samples than the uninterrupted one"
    m = read_metrics(resumed)
    assert m["status"] == "ok" and m["epochs"][-1]["samples"] == 160  # the 8 batches of 10 left of epoch 1, on 2 ranks


def _served(compose, name: str, root: str, split: str):
    """Every sample of a split as the format serves it (no augmentation): images and class names."""
    dm = ImageDataModule(compose(f"data={name}", f"data.root={root}", "data.image_size=32", "data.augment=false").data)
    dm.build()
    dataset = dm.train_set if split == "train" else dm.val_set
    from trainer.data.gpu_transforms import model_input

    images, labels = zip(*(dataset[i] for i in range(len(dataset))))
    return model_input(torch.stack(images)), [dm.classes[y] for y in labels]  # normalized: a model's units


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_format_serves_the_image_folders_images_with_their_labels(packed, small_images, compose, split):
    """Sample by sample, no training (so no shuffle order in the way): Parquet and WebDataset decode
    the folder's own bytes to the very same tensors, under the same class; packed arrays were resized
    when packed, so each is matched to its nearest folder image, which must carry its class and be
    close. A format that mislabels or misdecodes one sample fails here."""
    folder, folder_labels = _served(compose, "imagefolder", small_images, split)
    by_content = {hashlib.sha1(x.numpy().tobytes()).hexdigest(): y for x, y in zip(folder, folder_labels)}
    for fmt in BLOCK_FORMATS:
        images, labels = _served(compose, fmt, packed[fmt], split)
        assert len(labels) == len(folder_labels) > 0, fmt
        found = [by_content.get(hashlib.sha1(x.numpy().tobytes()).hexdigest()) for x in images]
        assert found == labels, fmt  # the same decoded tensor, under the same class, for every sample
    images, labels = _served(compose, "packed", packed["packed"], split)
    assert len(labels) == len(folder_labels)
    distance = (images[:, None] - folder[None]).abs().mean((2, 3, 4))  # mean abs difference, normalized units
    nearest = distance.argmin(1).tolist()
    assert [folder_labels[j] for j in nearest] == labels
    # resized differently when packed (about 0.2 on average), against 1.0-1.7 between different images
    assert distance.min(1).values.mean() < 0.35, distance.min(1).values


@pytest.mark.slow
def test_every_format_learns_well_above_chance(packed, small_images, train):
    """End to end through each format's loader, sampler and workers-free training: the tiny CNN learns
    these 10 classes far above chance (0.1) in 8 epochs with each (0.76-0.92 over seeds and formats).
    Whether the formats serve the same data is the test above; one run's accuracy moves by +-0.07
    with the shuffle order alone, too much to compare formats by."""
    common = ["data.image_size=32", "data.batch_size=16", "trainer.max_epochs=8", "seed=1"]
    for name, root in [
        ("imagefolder", small_images),
        ("packed", packed["packed"]),
        ("parquet", packed["parquet"]),
        ("webdataset", packed["webdataset"]),
    ]:
        m, _ = train(f"data={name}", f"data.root={root}", *common)
        assert m["val_samples"] == 50, (name, m["val_samples"])
        assert m["val_acc"] > 0.6, (name, m["val_acc"])


@pytest.mark.slow
def test_resumed_at_an_epoch_boundary_with_loader_workers_reads_the_next_epochs_order(small_images, tmp_path):
    # Lightning creates the loader's iterator before set_epoch on a restart; with workers it draws
    # indices at once, so without the checkpoint's epoch the first resumed epoch replayed epoch 0's order
    args = [
        f"data.root={small_images}",
        "data=imagefolder",
        "data.augment=false",
        "data.image_size=16",
        "data.batch_size=10",
        "data.num_workers=2",
        "trainer.max_epochs=2",
        "model.width=8",
        "monitor.enabled=false",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    r = run_cli(f"hydra.run.dir={straight}", *args, "checkpoint.keep_last_k=-1")
    assert r.returncode == 0, r.stderr[-3000:]
    first = next((straight / "checkpoints").glob("epoch000-*.ckpt"))
    r = run_cli(f"hydra.run.dir={resumed}", *args, f"ckpt_path={first}")
    assert r.returncode == 0, r.stderr[-3000:]
    a = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_shard_the_index_lists_but_the_store_lacks_is_one_paragraph_from_a_worker(packed, compose, tmp_path):
    import shutil

    from trainer.errors import ConfigError

    broken = tmp_path / "wds"
    shutil.copytree(packed["webdataset"], broken)
    (broken / "train" / "shard-000003.tar").unlink()
    dm = ImageDataModule(
        compose("data=webdataset", f"data.root={broken}", "data.batch_size=10", "data.num_workers=2").data
    )
    dm.build()
    with pytest.raises(ConfigError) as e:
        list(dm.train_dataloader())
    text = str(e.value)
    assert "shard-000003.tar" in text and "Traceback" not in text and "\n" not in text, text


def test_a_damaged_packed_dataset_is_one_paragraph_saying_to_pack_it_again(packed, compose, tmp_path):
    """Each of these raised its own traceback (JSONDecodeError, KeyError: 'size', mmap's ValueError,
    FileNotFoundError), also from every rank and in the middle of a sweep."""
    import shutil

    from trainer.errors import ConfigError

    damages = {
        "meta.json is not JSON": lambda d: (d / "meta.json").write_text("{not json"),
        "meta.json is empty": lambda d: (d / "meta.json").write_text("{}"),
        "images.npy is cut short": lambda d: (d / "images.npy").write_bytes((d / "images.npy").read_bytes()[:2000]),
        "labels.npy is missing": lambda d: (d / "labels.npy").unlink(),
    }
    for i, (what, damage) in enumerate(damages.items()):
        broken = tmp_path / f"packed{i}"
        shutil.copytree(packed["packed"], broken)
        damage(broken / "train")
        dm = ImageDataModule(compose("data=packed", f"data.root={broken}", "data.batch_size=10").data)
        with pytest.raises(ConfigError, match=r"is not a readable packed dataset.*Pack it again") as e:
            dm.build()
        assert "\n" not in str(e.value), what


def test_labels_that_are_not_class_numbers_are_named_with_their_file(packed, compose, tmp_path):
    """A Parquet label column of strings, a WebDataset .cls holding 'dog': each raised a TypeError or
    ValueError traceback from the label's reading."""
    import io
    import tarfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.data.webdataset import read_shard
    from trainer.errors import ConfigError

    (tmp_path / "pq" / "train").mkdir(parents=True)
    source = sorted((Path(packed["parquet"]) / "train").glob("*.parquet"))[0]
    table = pq.read_table(source)
    table = table.set_column(1, "label", pa.array([f"class{v}" for v in table.column("label").to_pylist()]))
    pq.write_table(table.replace_schema_metadata(None), tmp_path / "pq" / "train" / "train-00000-of-00001.parquet")
    dm = ImageDataModule(compose("data=parquet", f"data.root={tmp_path / 'pq'}", "data.batch_size=10").data)
    with pytest.raises(ConfigError, match=r"train-00000-of-00001\.parquet: its label column 'label' holds string"):
        dm.build()

    shard = io.BytesIO()
    with tarfile.open(fileobj=shard, mode="w") as tar:
        for name, data in (("000001.jpg", b"\xff\xd8"), ("000001.cls", b"dog\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ConfigError, match=r"shard-x\.tar: sample '000001' has the label 'dog'"):
        read_shard(shard.getvalue(), "shard-x.tar")


def test_decode_scale_decodes_every_format_at_the_image_folders_size(compose, tmp_path):
    """data.decode_scale=auto with data=parquet and data=webdataset: each sample is decoded at the size the
    image folder it was packed from decodes it at. 304 px JPEGs for 32 px crops: 1/4 (76 px; 1/8, 38 px,
    is below the 63 the smallest crop needs); with data.augment=false validation's resize needs 36 px,
    so 1/8. Off: full size. Seen on what each format's dataset decodes, the transform set aside."""
    import numpy as np
    from PIL import Image

    from trainer.data.pack import pack

    images = tmp_path / "images"
    rng = np.random.default_rng(0)
    for split, count in (("train", 3), ("val", 1)):
        for cls in ("a", "b"):
            (images / split / cls).mkdir(parents=True)
            for j in range(count):
                pixels = rng.integers(0, 255, (304, 352, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(images / split / cls / f"{j}.jpg")
    roots = {"imagefolder": str(images)}
    for fmt in BLOCK_FORMATS:
        pack(str(images), str(tmp_path / fmt), fmt=fmt)
        roots[fmt] = str(tmp_path / fmt)

    def short_sides(fmt: str, *overrides: str) -> set:
        cfg = compose(f"data={fmt}", f"data.root={roots[fmt]}", "data.image_size=32", "data.batch_size=2", *overrides)
        dm = ImageDataModule(cfg.data)
        dm.build()
        dm.train_set.transform = None  # the decoded image itself
        assert len(dm.train_set) == 6
        return {min(dm.train_set[i][0].size) for i in range(len(dm.train_set))}

    for fmt in roots:
        assert short_sides(fmt, "data.decode_scale=off") == {304}, fmt
        assert short_sides(fmt, "data.decode_scale=auto") == {76}, fmt
        assert short_sides(fmt, "data.decode_scale=auto", "data.augment=false") == {38}, fmt


def _folder(root: Path, counts: dict) -> Path:
    """Class folders of 8 px PNGs, each image its own colour (so its pixels say which file it is)."""
    from PIL import Image

    for c, (cls, n) in enumerate(counts.items()):
        (root / cls).mkdir(parents=True)
        for j in range(n):
            Image.new("RGB", (8, 8), (20 * c, 12 * j, 200 - 20 * c)).save(root / cls / f"{j}.png")
    return root


def _every_format(compose, src: Path, tmp_path, *overrides: str) -> dict:
    """src as each format reads it (trainer.pack's defaults: val_split 0.2, seed 42): name -> built datamodule."""
    from trainer.data.pack import pack

    roots = {"imagefolder": str(src)}
    for fmt, name in (("npy", "packed"), ("parquet", "parquet")):
        if not (tmp_path / name).exists():
            pack(str(src), str(tmp_path / name), size=8, fmt=fmt)
        roots[name] = str(tmp_path / name)
    built = {}
    for name, root in roots.items():
        cfg = compose(
            f"data={name}",
            f"data.root={root}",
            "data.image_size=8",
            "data.augment=false",
            "data.batch_size=2",
            *overrides,
        )
        dm = ImageDataModule(cfg.data, cfg.seed)
        dm.build()
        built[name] = dm
    return built


def _held_out(dm) -> list:
    """The val set's samples as (class name, pixels' hash), sorted: which images a format holds out."""
    images = [dm.val_set[i] for i in range(len(dm.val_set))]
    return sorted((dm.classes[y], hashlib.sha1(x.numpy().tobytes()).hexdigest()) for x, y in images)


def test_packed_holds_out_the_image_folders_val_images(compose, tmp_path):
    """data=packed split its array with one global permutation, data=imagefolder each class apart: the
    same folder validated on other images (and classes of 2 images on none or both)."""
    src = _folder(tmp_path / "src", {"a": 10, "b": 3, "c": 2})
    built = _every_format(compose, src, tmp_path)
    folder, packed = built["imagefolder"], built["packed"]
    assert (
        packed.val_set.indices == folder.val_set.indices and len(folder.val_set) == 3
    )  # the same rows: packed in order
    assert packed.train_set.indices == folder.train_set.indices
    assert _held_out(built["parquet"]) == _held_out(folder)


def test_the_held_out_images_follow_data_split_seed_not_the_runs_seed(compose, tmp_path):
    """A run's seed (a seed sweep, repeat_seeds) changes its training, not the images it is judged on: at
    any seed every format holds out what trainer.pack's shards hold out (its --seed 42 is
    data.split_seed's default); data.split_seed chooses other images."""
    src = _folder(tmp_path / "src", {"a": 10, "b": 10})
    default = _every_format(compose, src, tmp_path)
    other_seed = _every_format(compose, src, tmp_path, "seed=1")
    for name in default:
        assert _held_out(other_seed[name]) == _held_out(default[name]) == _held_out(default["parquet"]), name
    other_split = _every_format(compose, src, tmp_path, "data.split_seed=7")
    assert _held_out(other_split["imagefolder"]) != _held_out(default["imagefolder"])
    assert other_split["packed"].val_set.indices == other_split["imagefolder"].val_set.indices


def test_a_train_folder_without_val_is_held_out_alike_by_every_format(compose, tmp_path):
    src = _folder(tmp_path / "src" / "train", {"a": 5, "b": 5, "c": 5}).parent
    built = _every_format(compose, src, tmp_path)
    folder = built["imagefolder"]
    assert len(folder.val_set) == 3 and built["packed"].val_set.indices == folder.val_set.indices
    assert _held_out(built["parquet"]) == _held_out(folder)


def test_a_validation_folder_is_the_val_split_of_every_format(compose, tmp_path):
    _folder(tmp_path / "src" / "train", {"a": 4, "b": 4})
    src = _folder(tmp_path / "src" / "validation", {"a": 2, "b": 1}).parent
    for name, dm in _every_format(compose, src, tmp_path).items():
        assert len(dm.train_set) == 8 and len(dm.val_set) == 3, name


def test_every_format_reads_a_class_called_train_and_skips_hidden_folders(compose, tmp_path):
    """A flat folder whose classes include "train" (PASCAL VOC's), with a Jupyter checkpoint folder and a
    Mac zip's __MACOSX beside them: every format has the same three classes."""
    src = _folder(tmp_path / "voc", {"bus": 5, "car": 5, "train": 5, ".ipynb_checkpoints": 2, "__MACOSX": 1})
    for name, dm in _every_format(compose, src, tmp_path).items():
        assert dm.classes == ["bus", "car", "train"] and len(dm.train_set) + len(dm.val_set) == 15, name
