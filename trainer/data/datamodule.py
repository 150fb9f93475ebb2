"""The LightningDataModule behind every ``data=`` choice, with the loader knobs from config.

It also owns how a batch reaches the device: ``data.device_prefetch`` (a side-stream copy one batch
ahead, ``prefetch``) and ``data.decoder=nvjpeg`` (decode and transform on the device,
``device_decode``) both go through ``to_device``.

why longer: Lightning asks one LightningDataModule for every loader; each ``data=`` format's build,
each loader (torch, DALI, device-resident) and the hand-over to the device are short methods of
that one object, sharing its state (the datasets, the sampler, the epoch). Its seeds: ``seeding``.
"""

from __future__ import annotations

import functools
import logging
import zlib

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, IterableDataset

from trainer.data.augment import Augmentation

# imported here, not lazily: Lightning records the arguments of DataLoader subclasses that exist
# when it asks for a loader, so that it can re-create them with a distributed sampler
from trainer.data.prefetch import DevicePrefetchLoader, move_to_device
from trainer.data.seeding import SeededSamples, own_rngs, sample_seed, seed_rngs
from trainer.errors import ConfigError
from trainer.rank import world_size

log = logging.getLogger(__name__)

BLOCK_FORMATS = ("parquet", "webdataset")  # read by blocks (row groups, tar shards) with shards.BlockSampler


class ImageDataModule(pl.LightningDataModule):
    def __init__(
        self,
        data_cfg,
        seed: int = 42,
        accelerator: str = "cpu",
        processes_per_node: int = 1,
        channels_last: bool = False,
    ):
        super().__init__()
        self.cfg = data_cfg
        self.seed = seed
        self.accelerator = accelerator
        self.processes_per_node = processes_per_node
        self.decoder = data_cfg.get("decoder", "pil")
        self.augmentation = Augmentation.of(data_cfg)  # per-image augmentation (augment.py)
        self.repeats = int(data_cfg.get("repeated_augment", 1))  # draws of each sample per epoch (sampler.py)
        self.device_decoders = None  # data.decoder=nvjpeg: {train: DeviceDecoder, val: DeviceDecoder}
        self.dali = data_cfg.get("loader", "torch") == "dali"  # data.loader=dali (dali.py)
        self.dali_samples = None  # data.loader=dali: {train: [(path, label)], val: [...]}
        self.channels_last = channels_last  # the model's memory format: DALI hands it NHWC batches
        self.num_workers = self._workers()
        self.train_set = None
        self.val_set = None
        self.classes = None
        # (epoch, batches already trained in it): set by ResumableState for a mid-epoch resume
        self.resume_position: tuple | None = None
        # the epoch a resumed fit starts in (ResumableState reads it from the checkpoint's loop state)
        self.start_epoch = 0
        # the EpochTimer's StepClock: with data.device_prefetch the step loop's wait for a batch is
        # split into data wait and transfer by the prefetcher (set by trainer.run)
        self.step_clock = None
        # progressive_resize: the training image size of each epoch (set by trainer.run); None: data.image_size
        self.train_sizes: list | None = None
        # set by trainer.run: the built-in classifier's network normalizes uint8 batches itself, inside
        # its compiled graph (switches.model_transforms.ModelInput), so they are handed over as uint8
        self.model_normalizes = False

    def _workers(self) -> int:
        """data.auto_workers: the cores this node's ranks can spare, one main process each kept free."""
        c = self.cfg
        if not c.get("auto_workers"):
            return c.num_workers
        from trainer.measure.hardware import usable_cores, workers_per_process

        cores = usable_cores()
        workers = workers_per_process(cores, self.processes_per_node)
        log.info(
            "data.auto_workers: %d loader workers per process (%d cores, %d process(es) on this node)",
            workers,
            cores,
            self.processes_per_node,
        )
        return workers

    def _local_root(self, root):
        """data.cache=DIR: read from a local, checksummed copy of data.root."""
        if not self.cfg.get("cache") or not root:
            return root
        from trainer.data.cache import cached_copy

        return cached_copy(root, self.cfg.cache, self.cfg.get("storage_options"))

    def build(self) -> int:
        """Create the datasets (generating the built-in set if needed); return the number of classes.

        Called by ``trainer.run`` before the model exists, so a bad data path fails before
        anything is built, and the model's output layer can follow the data's class count.
        """
        c = self.cfg
        self._check_keys()
        if c.name == "synthetic":
            from trainer.data.synthetic import SyntheticImages

            u8 = bool(c.get("gpu_normalize"))
            self.train_set = SyntheticImages(
                c.num_samples, c.image_size, c.num_classes, self.seed, "train", keep_uint8=u8
            )
            val_size = self.augmentation.eval_size(c.image_size)  # data.eval_image_size
            self.val_set = (
                SyntheticImages(c.val_samples, val_size, c.num_classes, self.seed, "val", keep_uint8=u8)
                if c.val_samples
                else None
            )
            return c.num_classes
        if c.name == "packed":
            from trainer.data.packed import build_packed

            self.train_set, self.val_set, self.classes = build_packed(
                self._local_root(c.root),
                c.image_size,
                self.augmentation,
                c.val_split,
                self.seed,
                bool(c.get("gpu_normalize")),
                c.get("storage_options"),
            )
            return len(self.classes)
        if c.name in BLOCK_FORMATS:
            return self._build_blocks()
        if c.name == "custom":
            from hydra.utils import instantiate

            if not c.dataset or not c.dataset.get("_target_"):
                raise ConfigError(
                    "data=custom needs data.dataset._target_=pkg.module.MyDataset (a map-style Dataset "
                    "of (image, label)); its other data.dataset.* keys are passed as arguments."
                )
            self.train_set = instantiate(c.dataset, _convert_="all")
            self.val_set = instantiate(c.val_dataset, _convert_="all") if c.val_dataset else None
            unused = self.augmentation.set_keys()
            if unused:
                log.warning(
                    "%s: these act in the trainer's own image transforms, and data=custom brings its dataset with "
                    "its own: they change nothing here (data.mixup_alpha, data.cutmix_alpha and "
                    "data.repeated_augment still apply)",
                    ", ".join(unused),
                )
            return c.num_classes
        if c.name == "cifar10":
            return self._build_cifar10()
        return self._build_image_folders()

    @property
    def decoder_in_use(self) -> str:
        """What decodes the training images (metrics.json ``decoder``): the torch loader's decoder, or DALI's
        (on the CPU, or ``mixed``: nvJPEG on the GPU)."""
        if self.dali:
            return "dali-mixed" if self.accelerator == "cuda" else "dali-cpu"
        return self.decoder

    def _check_keys(self) -> None:
        """The data keys where they cannot act, before anything is built: said, or refused."""
        self._check_device_flags()
        self._check_repeated_augment()
        self._check_loader()

    def _check_repeated_augment(self) -> None:
        """data.repeated_augment where it cannot act: said (synthetic images: nothing to augment), or refused."""
        c = self.cfg
        if self.repeats > 1 and c.name == "synthetic":
            log.info(
                "data.repeated_augment=%d does nothing with data=synthetic: its images are not augmented", self.repeats
            )
            self.repeats = 1
        if self.repeats > 1 and c.name in BLOCK_FORMATS:
            raise ConfigError(
                f"data.repeated_augment={self.repeats} draws each sample several times per epoch, differently augmented; "
                f"data={c.name} cannot: its samples stream from blocks in order (the block sampler), not drawn by index. "
                "Use it with image folders (imagefolder, builtin, imagenette), cifar10, packed or custom data, or set "
                "data.repeated_augment=1."
            )

    def _check_device_flags(self) -> None:
        """data.device_prefetch and data.device_resident where they cannot act: said, or refused."""
        c = self.cfg
        if c.get("device_prefetch") and self.accelerator != "cuda":
            log.warning(
                "data.device_prefetch=true needs a CUDA GPU (it overlaps host-to-device copies with compute); on %s it does nothing",
                self.accelerator,
            )
        if c.get("device_resident"):
            if c.name != "synthetic":
                raise ConfigError(
                    f"data.device_resident=true keeps synthetic images on the device; data={c.name} reads real files. "
                    "Use it with data=synthetic, or use data.device_prefetch / data.gpu_normalize / data.decoder=nvjpeg for real images."
                )
            moot = [
                f"data.{k}={str(v).lower()}"
                for k, v in (
                    ("num_workers", self.num_workers),
                    ("pin_memory", c.pin_memory),
                    ("device_prefetch", c.get("device_prefetch")),
                )
                if v
            ]
            if moot:
                log.info(
                    "data.device_resident=true (data=synthetic's default): batches are gathered where the model "
                    "trains, so %s change nothing; set data.device_resident=false to measure the loader on synthetic data",
                    ", ".join(moot),
                )
            self.num_workers = 0

    def _build_cifar10(self) -> int:
        """data=cifar10: torchvision's pickled batches (downloaded once), raw pixels through the image folder's transforms."""
        from trainer.data.standard import build_cifar10, dataset_folder

        c = self.cfg
        unused = [
            f"{k}={str(v).lower()}"
            for k, v, default in (("decoder", c.decoder, "pil"), ("decode_scale", c.decode_scale, "off"))
            if v != default
        ] + (["cache_in_memory=true"] if c.cache_in_memory else [])
        if unused:
            log.warning(
                "data.%s changes nothing with data=cifar10: its images are raw pixels held in memory, with no file to read "
                "or decode",
                ", data.".join(unused),
            )
        self.decoder = None  # nothing is decoded (metrics.json says so)
        folder, key = dataset_folder(c, self._local_root)
        self.train_set, self.val_set, self.classes = build_cifar10(
            folder, c.image_size, self.augmentation, bool(c.gpu_normalize)
        )
        self._check_batch_fits(folder)
        return len(self.classes)

    def _check_batch_fits(self, root) -> None:
        c = self.cfg
        if c.drop_last and isinstance(c.batch_size, int) and len(self.train_set) < c.batch_size:
            raise ConfigError(
                f"data.batch_size={c.batch_size} is larger than the training set ({len(self.train_set)} images in {root}), "
                "so every batch would be dropped. Lower data.batch_size or set data.drop_last=false."
            )

    def _build_image_folders(self) -> int:
        """data=imagefolder / builtin / imagenette: class subfolders of JPEGs (the built-in set is generated
        once; Imagenette is downloaded once)."""
        c = self.cfg
        if c.name == "builtin":
            from trainer.data.builtin import ensure_builtin

            root, key = ensure_builtin(c.cache_dir, c.images_per_class, c.stored_size), "data.cache_dir"
        elif c.name == "imagenette":
            from trainer.data.standard import dataset_folder

            root, key = dataset_folder(c, self._local_root)
        else:
            root, key = self._local_root(c.root), "data.root"
        from trainer.data.folder import build_image_folders

        self.decoder = self._folder_decoder(root, key)
        self.train_set, self.val_set, self.classes = build_image_folders(
            root,
            c.image_size,
            self.augmentation,
            c.val_split,
            self.seed,
            key,
            c.on_bad_sample,
            decoder=self.decoder,
            cache_in_memory=c.cache_in_memory,
            keep_uint8=c.gpu_normalize,
            storage_options=c.get("storage_options"),
            decode_scale=c.decode_scale,
        )
        if len(self.train_set) == 0:
            raise ConfigError(f"'{key}' ({root}) has no training images.")
        if self.dali:
            from trainer.data.dali import samples_of

            val = samples_of(self.val_set) if self.val_set is not None else []
            self.dali_samples = {True: samples_of(self.train_set), False: val}
        if self.decoder == "nvjpeg":
            from trainer.data.device_decode import DeviceDecoder

            self.device_decoders = {
                train: DeviceDecoder(c.image_size, train, self.augmentation, c.on_bad_sample) for train in (True, False)
            }
        self._check_batch_fits(root)
        if c.name == "imagenette":  # class folders are WordNet ids: named by torchvision's table
            from trainer.data.standard import imagenette_wnids

            names = imagenette_wnids()
            self.classes = [names[wnid][0] for wnid in self.classes]
        return len(self.classes)

    def _folder_decoder(self, root, key: str) -> str:
        """The decoder of an image folder's datasets: data.decoder's, or with data.loader=dali PIL's, which
        then only lists the files and gives example batches (DALI decodes what trains)."""
        if not self.dali:
            from trainer.data.decoders import resolve_decoder

            decoder = resolve_decoder(self.cfg.decoder, self.accelerator)
            self._check_decode_scale(decoder)
            return decoder
        from trainer.data.storage import is_remote

        if is_remote(root):
            raise ConfigError(
                f"data.loader=dali reads local files, and {key} is {root}: set data.cache=DIR to read it from a local "
                "copy, or use data.loader=torch, which reads object stores file by file."
            )
        return "pil"

    def _check_loader(self) -> None:
        """data.loader=dali where it cannot act: refused (dali.check); keys it makes moot: said."""
        if not self.dali:
            return
        from trainer.data.dali import check, notes_on_other_keys

        check(self.cfg, self.augmentation)
        for note in notes_on_other_keys(self.cfg, self.accelerator):
            log.warning("%s; it changes nothing under data.loader=dali", note)

    def _check_decode_scale(self, decoder: str) -> None:
        from trainer.data.decoders import SCALED_DECODERS

        if self.cfg.decode_scale == "auto" and decoder not in SCALED_DECODERS:
            log.warning(
                "data.decode_scale=auto changes nothing with data.decoder=%s (torchvision's decoders cannot decode "
                "at a reduced size yet): use data.decoder=pil or turbo",
                decoder,
            )

    def _build_blocks(self) -> int:
        """data=parquet / data=webdataset: samples in blocks (row groups, tar shards), read by BlockSampler's plan."""
        c = self.cfg
        if c.decoder == "nvjpeg":
            raise ConfigError(
                f"data.decoder=nvjpeg decodes image files on the GPU; with data={c.name} use data.decoder=pil, torchvision or turbo."
            )
        from trainer.data.decoders import resolve_decoder

        self.decoder = resolve_decoder(c.decoder, self.accelerator)
        self._check_decode_scale(self.decoder)
        if c.name == "parquet":
            from trainer.data.parquet import build_parquet as build
        else:
            from trainer.data.webdataset import build_webdataset as build
        self.train_set, self.val_set, self.classes = build(
            self._local_root(c.root),
            c.image_size,
            self.augmentation,
            c.val_split,
            self.seed,
            bool(c.gpu_normalize),
            self.decoder,
            c.on_bad_sample,
            c.shuffle_window,
            c.get("storage_options"),
            decode_scale=c.decode_scale,
        )
        per_rank = -(-len(self.train_set) // max(1, world_size()))
        if c.drop_last and isinstance(c.batch_size, int) and per_rank < c.batch_size:
            raise ConfigError(
                f"data.batch_size={c.batch_size} is larger than the training samples each process gets ({per_rank} of {len(self.train_set)} in {c.root}), "
                "so every batch would be dropped. Lower data.batch_size or set data.drop_last=false."
            )
        return len(self.classes)

    def _block_sampler(self, dataset, train: bool):
        """The sampler for BlockImages: each rank and loader worker reads its own blocks (see shards)."""
        from trainer.data.shards import BlockImages, BlockSampler

        if not isinstance(dataset, BlockImages):
            return None
        sampler = BlockSampler(
            dataset.sizes, self.seed, train, self.cfg.batch_size, self.num_workers, self.cfg.shuffle_window
        )
        if train:
            self._apply_resume(sampler)
        sampler.stop = self._step_limit_samples(sum(dataset.sizes), train)
        return sampler

    def sampler_plan(self) -> tuple:
        """What BlockSampler's order depends on besides (seed, epoch): processes, loader workers, batch size."""
        if self.cfg.name not in BLOCK_FORMATS:
            return ()
        return (world_size(), max(1, self.num_workers), self.cfg.batch_size)

    @property
    def resumes_mid_epoch_distributed(self) -> bool:
        """The train sampler is rank-aware and can skip the trained batches on every rank (BlockSampler, and
        data.loader=dali's shares, which skip within each rank's own)."""
        return self.cfg.name in BLOCK_FORMATS or self.dali

    def _loader(self, dataset, train: bool) -> DataLoader:
        c = self.cfg
        if self.dali_samples is not None:
            return self._dali_loader(train)
        workers = self.num_workers
        sampler = self._block_sampler(dataset, train)
        if sampler is None and train:
            sampler = self._train_sampler(len(dataset))
            stop = self._step_limit_samples(len(sampler), train=True)
            if sampler.repeats > 1 or stop is not None:
                from trainer.data.sampler import RepeatedSamples, deal_to_ranks

                if sampler.repeats > 1:
                    dataset = RepeatedSamples(dataset, sampler.repeats)
                if self.trainer is not None:
                    # dealt here, not by Lightning: repeats go to different ranks (Lightning would scatter
                    # them), and a step limit stops each rank's share where its epoch stops. A distributed
                    # strategy of one process is dealt too: Lightning would wrap the sampler then as well
                    world = self.trainer.world_size
                    distributed = world > 1 or getattr(self.trainer, "distributed_sampler_kwargs", None) is not None
                    sampler = deal_to_ranks(sampler, self.trainer.global_rank, world, stop, distributed)
        if c.get("device_resident") and c.name == "synthetic":
            return self._device_resident_loader(dataset, sampler, train)
        if not train and sampler is None and not isinstance(dataset, IterableDataset):
            stop = self._step_limit_samples(len(dataset), train=False)
            if (
                stop is not None
            ):  # every rank's first samples: Lightning's unshuffled DistributedSampler deals them as before
                from trainer.data.sampler import FirstSamples

                dataset = FirstSamples(dataset, stop * self.trainer.world_size)
        from trainer.data.folder import skip_none_collate

        collate = None if c.name == "synthetic" else skip_none_collate
        if self.device_decoders:
            from trainer.data.device_decode import encoded_collate

            collate = functools.partial(encoded_collate, train=train)
        if train and workers == 0 and c.name != "synthetic" and not isinstance(dataset, IterableDataset):
            # (synthetic images draw nothing)
            dataset = SeededSamples(dataset, self.seed, functools.partial(self._epoch_now, sampler))
        kwargs = dict(
            batch_size=c.batch_size,
            sampler=sampler,
            collate_fn=collate,
            drop_last=train and c.drop_last,
            num_workers=workers,
            pin_memory=c.pin_memory,
            persistent_workers=c.persistent_workers and workers > 0,
            prefetch_factor=c.prefetch_factor if workers > 0 else None,
        )
        device = self._prefetch_device()
        if device is None:
            return DataLoader(dataset, **kwargs)
        # an asynchronous copy needs page-locked host memory
        kwargs["pin_memory"] = kwargs["pin_memory"] or device.type == "cuda"
        return DevicePrefetchLoader(dataset, device=device, transfer=self.to_device, clock=self.step_clock, **kwargs)

    def _step_limit_samples(self, samples: int, train: bool) -> int | None:
        """``trainer.limit_train_batches`` / ``limit_val_batches`` as the samples each rank's loader is to
        draw of an epoch of ``samples`` (over every rank), where a number of batches cuts the epoch
        short; None where the whole epoch runs. A loader that draws only those is what keeps persistent
        workers from building batches past the limit that the next epoch must drain (sampler.py's
        docstring). A fraction (a float) is left to Lightning: it takes that fraction of the loader's
        length, which a shorter loader would change."""
        if self.trainer is None or not isinstance(self.cfg.batch_size, int):
            return None
        limit = self.trainer.limit_train_batches if train else self.trainer.limit_val_batches
        if not isinstance(limit, int) or isinstance(limit, bool):
            return None
        size = self.cfg.batch_size
        per_rank = -(-samples // self.trainer.world_size)  # padded to even shares, as Lightning deals them
        batches = per_rank // size if train and self.cfg.drop_last else -(-per_rank // size)
        return limit * size if 0 < limit < batches else None

    def _dali_loader(self, train: bool):
        """data.loader=dali: this rank's DALI loader, over the files the torch loader would read (dali.py)."""
        from torch.utils.data import DistributedSampler

        from trainer.data.dali import DaliLoader
        from trainer.data.sampler import deal_to_ranks

        samples = self.dali_samples[train]
        n = len(samples)
        world, rank = (self.trainer.world_size, self.trainer.global_rank) if self.trainer is not None else (1, 0)
        # a step limit: the pipeline reads only the files of the batches the epoch uses (as _loader's samplers)
        stop = self._step_limit_samples(n, train)
        if train:
            sampler = self._train_sampler(n)  # the epoch's permutation, repeats and a resume's skip
            dealt = deal_to_ranks(sampler, rank, world, stop=stop)

            def order_of(epoch: int) -> list:
                skip = sampler.skip.pop(epoch, 0)  # a mid-epoch resume: what this rank trained, from its own share
                dealt.set_epoch(epoch)
                return [i % n for i in dealt][skip:]
        else:  # as Lightning deals the torch loader's validation: not shuffled, padded to even shares
            dealt = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False)

            def order_of(epoch: int) -> list:
                return list(dealt)[:stop]

        if self.trainer is not None:
            device = self.trainer.strategy.root_device
        else:  # used on its own: the accelerator's current device
            device = (
                torch.device("cuda", torch.cuda.current_device()) if self.accelerator == "cuda" else torch.device("cpu")
            )
        return DaliLoader(
            samples,
            order_of,
            lambda: self._epoch_now(None),
            len(dealt) if stop is None else min(stop, len(dealt)),  # this rank's samples in an epoch
            # the crops of (seed, epoch, rank): an epoch's are the same after a resume
            seed_of=lambda epoch: sample_seed(self.seed, epoch, rank) & 0x7FFFFFFF,
            train=train,
            batch_size=self.cfg.batch_size,
            image_size=self.cfg.image_size,
            augmentation=self.augmentation,
            threads=self.num_workers,
            device_id=(device.index or 0) if device.type == "cuda" else None,
            keep_uint8=bool(self.cfg.gpu_normalize),
            channels_last=self.channels_last,
            drop_last=train and self.cfg.drop_last,
        )

    def _epoch_now(self, sampler) -> int:
        """The epoch being trained: the fit's (a distributed sampler wrapping ours leaves our epoch
        as it was), else the sampler's, when the loader is used on its own."""
        if self.trainer is not None:
            return self.trainer.current_epoch
        return getattr(sampler, "epoch", 0)

    def _train_sampler(self, length: int):
        from trainer.data.sampler import EpochShuffleSampler

        sampler = EpochShuffleSampler(length, self.seed, self.repeats)
        self._apply_resume(sampler)
        return sampler

    def _apply_resume(self, sampler) -> None:
        """A resume: the sampler starts in the resumed epoch, skipping the batches already trained in it.

        The sampler starts at that epoch, not 0: on a restart Lightning creates the loader's iterator
        before it calls ``set_epoch``, and with loader workers the iterator draws indices at once.
        """
        sampler.epoch = self.start_epoch
        if self.resume_position:
            epoch, batches = self.resume_position
            sampler.skip[epoch] = batches * self.cfg.batch_size
            sampler.epoch = epoch
            self.resume_position = None

    def _device_resident_loader(self, dataset, sampler, train: bool) -> DataLoader:
        """data.device_resident: batches gathered on the device; no workers, pinning or copies."""
        from trainer.data.synthetic import DeviceResidentImages, batch_as_is

        device = self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        return DataLoader(
            DeviceResidentImages(dataset, device),
            batch_size=self.cfg.batch_size,
            sampler=sampler,
            collate_fn=batch_as_is,
            drop_last=train and self.cfg.drop_last,
            num_workers=0,
        )

    def _prefetch_device(self):
        """The device that data.device_prefetch copies to, or None when it is off (or not on CUDA)."""
        if not self.cfg.get("device_prefetch") or self.accelerator != "cuda" or self.trainer is None:
            return None
        return self.trainer.strategy.root_device

    def to_device(self, batch, device: torch.device):
        """Host batch -> device batch: decoded there with data.decoder=nvjpeg, else copied (non_blocking).

        The device decode's training crops and flips draw their parameters from the host's RNGs here,
        after the loader workers and, with data.device_prefetch, in its thread ahead of the step: they
        are drawn from a seed of the epoch and the batch's files (as ``SeededSamples`` does for the
        transforms in the main process), so a resumed run decodes the crops the run it continues did.
        """
        from trainer.data.device_decode import EncodedBatch

        if isinstance(batch, EncodedBatch):
            decode = self.device_decoders[batch.train]
            if not batch.train:
                return decode(batch, device)
            files = zlib.crc32("\0".join(batch.paths).encode())
            with own_rngs():
                seed_rngs(sample_seed(self.seed, self._epoch_now(None), files))
                return decode(batch, device)
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        """data.gpu_normalize, data.decoder=nvjpeg, device-resident synthetic data: uint8 batches arrive
        on the device and are normalized here, or by the built-in classifier's network where it does
        that itself (``model_normalizes``: in its compiled graph, fused with its first layer).

        The datamodule's hook, so that a user's own LightningModule gets float batches as documented.
        Lightning calls only the datamodule's hook when both define one, so this one then calls the
        LightningModule's own, after normalizing: a user's hook still runs, and sees what its model
        will see.
        """
        from pytorch_lightning.utilities.model_helpers import is_overridden

        from trainer.data.gpu_transforms import model_input
        from trainer.data.progressive import resize_batch

        if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
            images = batch[0] if self.model_normalizes else model_input(batch[0])
            if self.train_sizes and self.trainer is not None and self.trainer.training:
                images = resize_batch(images, self.train_size(self.trainer.current_epoch))
            batch = type(batch)([images, *batch[1:]])
        model = self.trainer.lightning_module if self.trainer is not None else None
        if model is not None and is_overridden("on_after_batch_transfer", model):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch

    def train_size(self, epoch: int) -> int:
        """The training image size of ``epoch`` (progressive_resize), else data.image_size."""
        if not self.train_sizes:
            return self.cfg.image_size
        return self.train_sizes[min(epoch, len(self.train_sizes) - 1)]

    def teardown(self, stage: str) -> None:
        from trainer.data.prefetch import close_all

        close_all()  # data.device_prefetch: no producer thread outlives the fit (a sweep's next job runs in this process)

    def on_exception(self, exception: BaseException) -> None:
        """A fit that fails or is stopped (a crash, on_nan=stop, a stop signal): Lightning calls
        ``teardown`` only after a fit that ends well, and its own clean-up after a failure may not
        get as far as the loader's iterator (it raises again after a CUDA error), so the
        data.device_prefetch threads, the device batches they hold and their loader's workers are
        stopped here, before the next job of a local sweep starts in this process."""
        from trainer.data.prefetch import close_all

        close_all()

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        # Lightning's hook; a prefetched batch is already there, and moving it again does nothing
        return self.to_device(batch, device)

    def example_batch(self, size: int, device: torch.device = torch.device("cpu")):
        """``size`` training samples as one batch on ``device``, as the model's forward takes them."""
        from trainer.data.gpu_transforms import model_input

        n = len(self.train_set)
        good = []
        for i in range(n):  # skipped (undecodable) samples come back as None
            sample = self.train_set[i]
            if sample is not None:
                good.append(sample)
            if len(good) == min(size, n):
                break
        if not good:
            raise ConfigError(
                "None of the training images could be decoded (each was skipped, see the warnings above); check data.root."
            )
        samples = [good[i % len(good)] for i in range(size)]
        if self.device_decoders is not None:
            from trainer.data.device_decode import encoded_collate

            x, y = self.to_device(encoded_collate(samples), device)
        else:
            x, y = (
                torch.stack([s[0] for s in samples]).to(device),
                torch.tensor([int(s[1]) for s in samples], device=device),
            )
        return model_input(x), y

    def expected_batch_size(self, batch_idx: int) -> int:
        """How many samples training batch ``batch_idx`` holds when no sample is skipped."""
        c = self.cfg
        if c.drop_last:
            return c.batch_size
        return min(c.batch_size, len(self.train_set) - batch_idx * c.batch_size)

    def train_dataloader(self) -> DataLoader:
        if self.train_set is None:
            self.build()
        return self._loader(self.train_set, train=True)

    def val_dataloader(self):
        if self.train_set is None:
            self.build()
        return self._loader(self.val_set, train=False) if self.val_set is not None and len(self.val_set) else []
