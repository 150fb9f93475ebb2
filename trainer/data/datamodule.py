"""The LightningDataModule behind every ``data=`` choice: it builds the data sets of each format and
hands Lightning the loaders of the loader object the data keys choose (``trainer.data.loaders``: torch
workers, nvJPEG, device-resident synthetic images, DALI), whose position inside an epoch it keeps in
the checkpoint through its own ``state_dict``/``load_state_dict`` hooks.

why longer: Lightning asks one LightningDataModule for every loader and hook; each ``data=`` format's
build is a short method of that one object, sharing its state (the data sets, the classes). Its
seeds: ``seeding``.
"""

from __future__ import annotations

import logging

import pytorch_lightning as pl
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from pytorch_lightning.utilities.model_helpers import is_overridden

from trainer.data import decoders  # decoders.resolve_decoder: a test runs the nvjpeg path on a CPU through it
from trainer.data.augment import Augmentation
from trainer.data.builtin import ensure_builtin
from trainer.data.cache import cached_copy
from trainer.data.dali import check, notes_on_other_keys
from trainer.data.decoders import SCALED_DECODERS

# EpochAheadLoader and DevicePrefetchLoader are imported with the datamodule, though unused by name here:
# Lightning records the arguments of DataLoader subclasses that exist when it asks for a loader, so that it
# can re-create them with a distributed sampler
from trainer.data.epoch_ahead import (
    EpochAheadLoader,  # noqa: F401
    drop_all,
)
from trainer.data.folder import build_image_folders
from trainer.data.gpu_transforms import model_input
from trainer.data.loaders import Loaders, LoaderSetup, loaders_for
from trainer.data.packed import build_packed
from trainer.data.parquet import build_parquet
from trainer.data.prefetch import (
    DevicePrefetchLoader,  # noqa: F401
    PrefetchWaits,
    close_all,
)
from trainer.data.progressive import resize_batch
from trainer.data.standard import build_cifar10, dataset_folder, imagenette_wnids
from trainer.data.storage import is_remote
from trainer.data.synthetic import SyntheticImages
from trainer.data.webdataset import build_webdataset
from trainer.errors import ConfigError, cause_text
from trainer.measure import hardware
from trainer.rank import world_size

log = logging.getLogger(__name__)

BLOCK_FORMATS = ("parquet", "webdataset")  # read by blocks (row groups, tar shards) with shards.BlockSampler


def _user_dataset(node, key: str):
    """data=custom's Dataset, built from ``key``; a target that cannot be built is one paragraph naming
    it (Hydra's "Error locating target", with a hint to set HYDRA_FULL_ERROR, before)."""
    try:
        return instantiate(node, _convert_="all")
    except InstantiationException as e:
        raise ConfigError(
            f"Could not build the dataset from '{key}._target_={node.get('_target_')}': {cause_text(e)}. It must name an "
            f"importable Dataset class (or a function returning one); the other {key}.* keys are passed to it as arguments."
        ) from None


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
        self.dali = data_cfg.get("loader", "torch") == "dali"  # data.loader=dali (dali.py)
        self.channels_last = channels_last  # the model's memory format: DALI hands it NHWC batches
        self.num_workers = self._workers()
        self.train_set = None
        self.val_set = None
        self.classes = None
        self.loaders: Loaders | None = None  # the loader object, chosen once the data sets are built
        self._loader_state = None  # a checkpoint's loader state, restored before the loader object exists
        # data.device_prefetch: the prefetching loader records the step loop's waits for a batch here,
        # and the epoch timer's StepClock reads them to split data wait from transfer
        self.prefetch_waits = PrefetchWaits()
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
        cores = hardware.usable_cores()
        workers = hardware.workers_per_process(cores, self.processes_per_node)
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

        return cached_copy(root, self.cfg.cache, self.cfg.get("storage_options"))

    def build(self) -> int:
        """Create the datasets (generating the built-in set if needed) and the loader object; return
        the number of classes.

        Called by ``trainer.run`` before the model exists, so a bad data path fails before
        anything is built, and the model's output layer can follow the data's class count.
        """
        self._check_keys()
        classes = self._build_sets()
        setup = LoaderSetup(
            cfg=self.cfg,
            seed=self.seed,
            workers=self.num_workers,
            repeats=self.repeats,
            augmentation=self.augmentation,
            accelerator=self.accelerator,
            decoder=self.decoder,
            channels_last=self.channels_last,
            prefetch_waits=self.prefetch_waits,
        )
        self.loaders = loaders_for(setup, self.train_set, self.val_set)
        if self._loader_state is not None:
            self.loaders.load_state_dict(self._loader_state)
            self._loader_state = None
        return classes

    def _build_sets(self) -> int:
        c = self.cfg
        if c.name == "synthetic":
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
            self.train_set, self.val_set, self.classes = build_packed(
                self._local_root(c.root),
                c.image_size,
                self.augmentation,
                c.val_split,
                c.split_seed,
                bool(c.get("gpu_normalize")),
                c.get("storage_options"),
            )
            return len(self.classes)
        if c.name in BLOCK_FORMATS:
            return self._build_blocks()
        if c.name == "custom":
            if not c.dataset or not c.dataset.get("_target_"):
                raise ConfigError(
                    "data=custom needs data.dataset._target_=pkg.module.MyDataset (a map-style Dataset "
                    "of (image, label)); its other data.dataset.* keys are passed as arguments."
                )
            self.train_set = _user_dataset(c.dataset, "data.dataset")
            self.val_set = _user_dataset(c.val_dataset, "data.val_dataset") if c.val_dataset else None
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

    def describe_loader(self) -> dict:
        """The loader in metrics.json (``loader``, ``decoder``, ``num_workers``): the loader object's own words."""
        if self.loaders is None:
            return {"loader": None, "decoder": self.decoder, "num_workers": self.num_workers}
        return self.loaders.describe()

    def state_dict(self) -> dict:
        """Lightning's hook, saved in every checkpoint: the loader object's position (an exact resume)."""
        return self.loaders.state_dict() if self.loaders is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if self.loaders is None:  # restored before build(): kept until the loader object exists
            self._loader_state = state_dict
        else:
            self.loaders.load_state_dict(state_dict)

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
            root, key = ensure_builtin(c.cache_dir, c.images_per_class, c.stored_size), "data.cache_dir"
        elif c.name == "imagenette":
            root, key = dataset_folder(c, self._local_root)
        else:
            root, key = self._local_root(c.root), "data.root"

        self.decoder = self._folder_decoder(root, key)
        self.train_set, self.val_set, self.classes = build_image_folders(
            root,
            c.image_size,
            self.augmentation,
            c.val_split,
            c.split_seed,
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
        self._check_batch_fits(root)
        if c.name == "imagenette":  # class folders are WordNet ids: named by torchvision's table
            names = imagenette_wnids()
            self.classes = [names[wnid][0] for wnid in self.classes]
        return len(self.classes)

    def _folder_decoder(self, root, key: str) -> str:
        """The decoder of an image folder's datasets: data.decoder's, or with data.loader=dali PIL's, which
        then only lists the files and gives example batches (DALI decodes what trains)."""
        if not self.dali:
            decoder = decoders.resolve_decoder(self.cfg.decoder, self.accelerator)
            self._check_decode_scale(decoder)
            return decoder

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

        check(self.cfg, self.augmentation)
        for note in notes_on_other_keys(self.cfg, self.accelerator):
            log.warning("%s; it changes nothing under data.loader=dali", note)

    def _check_decode_scale(self, decoder: str) -> None:
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

        self.decoder = decoders.resolve_decoder(c.decoder, self.accelerator)
        self._check_decode_scale(self.decoder)
        build = build_parquet if c.name == "parquet" else build_webdataset
        self.train_set, self.val_set, self.classes = build(
            self._local_root(c.root),
            c.image_size,
            self.augmentation,
            c.val_split,
            c.split_seed,
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

    def to_device(self, batch, device: torch.device):
        """Host batch -> device batch, as the loader object hands it over (decoded there with
        data.decoder=nvjpeg, else copied, non_blocking)."""
        return self.loaders.to_device(batch, device)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        """data.gpu_normalize, data.decoder=nvjpeg, device-resident synthetic data: uint8 batches arrive
        on the device and are normalized here, or by the built-in classifier's network where it does
        that itself (``model_normalizes``: in its compiled graph, fused with its first layer).

        The datamodule's hook, so that a user's own LightningModule gets float batches as documented.
        Lightning calls only the datamodule's hook when both define one, so this one then calls the
        LightningModule's own, after normalizing: a user's hook still runs, and sees what its model
        will see.
        """
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
        close_all()  # data.device_prefetch: no producer thread outlives the fit (a sweep's next job runs in this process)
        drop_all()  # nor an epoch's workers started ahead for an epoch that did not come

    def on_exception(self, exception: BaseException) -> None:
        """A fit that fails or is stopped (a crash, on_nan=stop, a stop signal): Lightning calls
        ``teardown`` only after a fit that ends well, and its own clean-up after a failure may not
        get as far as the loader's iterator (it raises again after a CUDA error), so the
        data.device_prefetch threads, the device batches they hold and their loader's workers are
        stopped here, before the next job of a local sweep starts in this process (and the workers
        of an epoch started ahead)."""
        close_all()
        drop_all()

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        # Lightning's hook; a prefetched batch is already there, and moving it again does nothing
        return self.to_device(batch, device)

    def example_batch(self, size: int, device: torch.device = torch.device("cpu")):
        """``size`` training samples as one batch on ``device``, as the model's forward takes them."""
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
        x, y = self.loaders.example(samples, device)
        return model_input(x), y

    def expected_batch_size(self, batch_idx: int) -> int:
        """How many samples training batch ``batch_idx`` holds when no sample is skipped."""
        c = self.cfg
        if c.drop_last:
            return c.batch_size
        return min(c.batch_size, len(self.train_set) - batch_idx * c.batch_size)

    def train_dataloader(self):
        if self.train_set is None:
            self.build()
        self.loaders.trainer = self.trainer
        return self.loaders.train(self.train_set)

    def val_dataloader(self):
        if self.train_set is None:
            self.build()
        if self.val_set is None or not len(self.val_set):
            return []
        self.loaders.trainer = self.trainer
        return self.loaders.val(self.val_set)
