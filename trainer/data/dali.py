"""data.loader=dali: NVIDIA DALI as the input pipeline of an image folder.

DALI reads the files, decodes the JPEGs, crops, flips and normalizes in its own C++ thread pool,
outside the Python GIL (on the CPU: libjpeg-turbo; on a GPU, ``mixed``: nvJPEG and the hardware
decoder of A100/H100), and hands torch tensors to Lightning through its PyTorch plugin. It is the
pipeline the GPU references use when the loader is the bottleneck; here it is one more switch, so
that "would DALI pay on my model?" is a row of the A/B table.

What it does as the torch loader does, so that a row differs only in the pipeline:

- **Which files, in which order**: each epoch's files are ``EpochShuffleSampler``'s order (a pure
  function of seed and epoch, the torch loader's), dealt to the ranks by the same
  ``DistributedSamplerWrapper`` Lightning wraps the torch loader's sampler in (``sampler.deal_to_ranks``):
  disjoint samples per rank, the same samples per rank as with ``data.loader=torch``,
  ``data.repeated_augment`` as there, and a resume that starts the epoch (or the rest of it) where
  the run it continues stopped. DALI's own ``random_shuffle``/``shuffle_after_epoch`` and
  ``shard_id`` would give another order, and its position after epoch E could only come back from
  every rank's DALI checkpoint (a Lightning checkpoint holds rank 0's state), so the reader gets
  the epoch's list itself (``readers.file(files=...)``): one pipeline per epoch, built in
  milliseconds, seeded by (seed, epoch, rank) so an epoch's crops are the same after a resume at an
  epoch boundary.
- **The pixels decoded**: a JPEG's EXIF orientation tag is not applied (DALI's decoders apply it by
  default; Pillow, torchvision and simplejpeg, as the torch loader calls them, do not), so a photo
  stored sideways reaches the model the same way under either loader.
- **The transforms** (``augment.transforms_for``'s): random-resized crop at ``data.crop_min_scale``
  .. 1 of the area and aspect ratios 3/4 .. 4/3 (DALI decodes only the crop's region, its own
  reduced-size decode), an even horizontal flip, ImageNet normalization; validation resizes the
  short side to ``data.eval_resize_ratio`` x the eval size and center-crops. uint8 out with
  ``data.gpu_normalize`` (the device normalizes); NHWC out when the model is ``channels_last``,
  handed over as an NCHW view with channels-last strides, so the model's input needs no copy.
- **Measured as a loader**: the step loop's wait in ``__next__`` is data wait (``StepClock``); DALI's
  prefetch queue is the loader. ``data.num_workers`` (or ``data.auto_workers``) is DALI's thread count.

- **The automatic policies** (``data.augment_policy``) as DALI's own (``nvidia.dali.auto_aug``), after
  the crop on uint8 pixels as torchvision orders them, with torchvision's fill and translation ranges.

What DALI has no operator for here (random erasing's box drawing) and the formats it cannot read
(Parquet, WebDataset, packed arrays, CIFAR-10's pickles, object-store roots) are refused in one
paragraph naming the key (``check``).
"""

from __future__ import annotations

import importlib.util
import math
from typing import Callable, List, Optional, Sequence, Tuple

from PIL import Image
from torch.utils.data import Subset

from trainer.data.augment import CROP_RATIO, Augmentation
from trainer.data.gpu_transforms import IMAGENET_MEAN, IMAGENET_STD
from trainer.errors import ConfigError, TrainingStopped

FOLDER_FORMATS = ("imagefolder", "builtin", "imagenette")
READER = "Reader"
INSTALL = (
    "pip install 'trainer-switchboard[dali]' (NVIDIA's nvidia-dali-cuda130 wheel, for a torch built with CUDA 13 "
    "or for the CPU) or 'trainer-switchboard[dali-cuda12]' (nvidia-dali-cuda120, for a torch built with CUDA 12)"
)


def installed() -> bool:
    """Whether DALI is there to import (found, not imported: the doctor and the tuner ask, and a loaded
    DALI would add its libraries to a sweep's next job's memory)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except (ImportError, ValueError):  # ValueError: imported as None (blocked), or without a spec
        return False


def _importable() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):  # OSError: its libraries cannot be loaded here
        return False
    return True


def check(data_cfg, augmentation: Augmentation) -> None:
    """data.loader=dali where it cannot act: one paragraph naming the key, before anything is built."""
    c = data_cfg
    if c.name not in FOLDER_FORMATS:
        raise ConfigError(
            f"data.loader=dali reads JPEG files from class folders (data=imagefolder, builtin or imagenette); "
            f"data={c.name} {_why_not(c.name)}. Use data.loader=torch with data={c.name}, or point data=imagefolder "
            "at a folder of class subfolders of images."
        )
    if augmentation.random_erasing > 0:
        raise ConfigError(
            f"data.random_erasing={augmentation.random_erasing} cannot run under data.loader=dali: DALI erases boxes "
            "it is given (fn.erase) but has no operator that draws them as torchvision's RandomErasing does (area, "
            "aspect ratio, ten tries to fit). Set data.loader=torch to use it (the policies, data.mixup_alpha, "
            "data.cutmix_alpha and data.repeated_augment work with either loader)."
        )
    if not _importable():
        raise ConfigError(
            f"data.loader=dali needs NVIDIA DALI, which is not installed here: {INSTALL}; or set data.loader=torch."
        )


def _why_not(name: str) -> str:
    return {
        "synthetic": "makes its images in memory: there are no files to read",
        "cifar10": "is torchvision's CIFAR-10, stored as pickled arrays, not image files",
        "packed": "is decoded arrays in one file, which the torch loader crops directly",
        "parquet": "holds images inside Parquet row groups, which DALI's file reader cannot open",
        "webdataset": "holds images inside tar shards (DALI's own webdataset reader needs index files this trainer does not write)",
        "custom": "is a Dataset object of yours, which DALI cannot read",
    }.get(name, "is not a folder of image files")


def notes_on_other_keys(data_cfg, accelerator: str) -> List[str]:
    """Keys that do nothing under data.loader=dali, said once at build (not refused: the run is the same
    run without them)."""
    c = data_cfg
    said = []
    if c.get("decoder", "pil") not in ("pil", "nvjpeg"):
        said.append(
            f"data.decoder={c.decoder}: DALI decodes with its own decoder (libjpeg-turbo on the CPU, nvJPEG on a GPU)"
        )
    if c.get("decoder") == "nvjpeg" and accelerator != "cuda":
        said.append("data.decoder=nvjpeg: without a CUDA GPU DALI decodes on the CPU")
    if c.get("decode_scale", "off") != "off":
        said.append("data.decode_scale: DALI decodes only the region a training crop keeps, on its own")
    if c.get("cache_in_memory"):
        said.append("data.cache_in_memory: DALI reads the files itself (the OS page cache keeps them)")
    if c.get("device_prefetch"):
        said.append("data.device_prefetch: DALI's own prefetch queue hands the batches over")
    return said


def samples_of(dataset) -> List[Tuple[str, int]]:
    """(path, label) of each sample of an ImageFolder, or of a Subset of one, in index order."""
    if isinstance(dataset, Subset):
        inner = samples_of(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    return [(str(p), int(y)) for p, y in dataset.samples]


class DaliLoader:
    """What Lightning iterates over as this rank's train or val loader: one DALI pipeline per epoch,
    over this epoch's files (``order_of(epoch)``), yielding (images, labels) batches."""

    def __init__(
        self,
        samples: Sequence[Tuple[str, int]],
        order_of: Callable[[int], List[int]],
        epoch_of: Callable[[], int],
        per_epoch: int,
        *,
        train: bool,
        batch_size: int,
        image_size: int,
        augmentation: Augmentation,
        threads: int,
        seed_of: Callable[[int], int],
        device_id: Optional[int] = None,
        keep_uint8: bool = False,
        channels_last: bool = False,
        drop_last: bool = False,
    ) -> None:
        self.samples = list(samples)
        self.order_of = order_of  # epoch -> this rank's sample indices (less what a resume already trained)
        self.epoch_of = epoch_of
        self.per_epoch = per_epoch  # this rank's samples in a whole epoch
        self.train = train
        self.batch_size = batch_size
        self.image_size = image_size
        self.augmentation = augmentation
        self.threads = max(1, int(threads))
        self.seed_of = seed_of  # epoch -> the pipeline's seed (its crops and flips)
        self.device_id = device_id
        self.keep_uint8 = keep_uint8
        self.channels_last = channels_last
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self._batches(self.per_epoch)

    def _batches(self, samples: int) -> int:
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def __iter__(self):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # lazy: optional ([dali] extra)

        epoch = self.epoch_of()
        indices = self.order_of(epoch)
        count = self._batches(len(indices))
        if count == 0:
            return
        files = [self.samples[i][0] for i in indices]
        labels = [self.samples[i][1] for i in indices]
        pipe = build_pipeline(files, labels, self, self.seed_of(epoch))
        policy = LastBatchPolicy.DROP if self.drop_last else LastBatchPolicy.PARTIAL
        batches, done = None, 0  # samples handed over this epoch
        try:  # the iterator runs the pipeline's first batches as it is made: a bad file can stop it there
            batches = DALIGenericIterator([pipe], ["images", "labels"], reader_name=READER, last_batch_policy=policy)
            for i in range(count):
                (out,) = next(batches)
                images = out["images"]
                if self.channels_last:  # NHWC from DALI: the same memory seen as NCHW, channels-last strides
                    images = images.permute(0, 3, 1, 2)
                done += images.shape[0]
                if i == count - 1:
                    # Lightning stops after len() batches and lets this generator go only when it asks for
                    # the next epoch's: the pipeline and its threads go with the last batch (its tensors are
                    # torch's own copies), not an epoch later
                    batches = pipe = None
                yield images, out["labels"].view(-1).long()
        except RuntimeError as e:
            if "Critical error in pipeline" not in str(e):
                raise
            # DALI's error names the operator, not the file: the failing batch is among the next few
            # (its prefetch queue runs ahead), so those files are tried one by one
            raise TrainingStopped(_undecodable(files[done : done + 4 * self.batch_size], e)) from None
        finally:
            del batches, pipe  # its threads and buffers go now, not at the next collection


def _undecodable(files: List[str], error: Exception) -> str:
    """The paragraph for a batch DALI could not decode, naming the files no decoder can read."""
    bad = []
    for path in files:
        try:
            with Image.open(path) as image:
                image.convert("RGB")
        except Exception:  # any reason a file cannot be read as an image
            bad.append(path)
    reason = next((line.strip() for line in str(error).splitlines() if "failure" in line or "rror:" in line), "")
    which = f"cannot decode {', '.join(bad)}" if bad else "could not decode a file of the next batches"
    return (
        f"data.loader=dali: DALI {which}{f' ({reason})' if reason else ''}; it stops at an undecodable file "
        "(data.on_bad_sample=skip, which skips and counts such files, works with data.loader=torch). Remove or "
        "replace the file, or set data.loader=torch."
    )


def build_pipeline(files: List[str], labels: List[int], loader: DaliLoader, seed: int):
    """The DALI pipeline of one epoch: read ``files`` in order, decode, transform as ``transforms_for``
    (crop or resize + center crop, then the automatic policy on uint8 pixels, then flip and normalize)."""
    # why longer: the training and the validation graph share the reader, the decoder's device, the
    # policy and the last op's arguments; apart, each would repeat them
    from nvidia.dali import fn, pipeline_def, types

    augment = loader.augmentation
    decoder = "mixed" if loader.device_id is not None else "cpu"
    policy = loader.train and augment.policy != "none"

    @pipeline_def(
        batch_size=loader.batch_size,
        num_threads=loader.threads,
        device_id=loader.device_id,
        seed=seed,
        prefetch_queue_depth=2,
        enable_conditionals=policy,  # DALI's automatic augmentations choose their ops per sample
    )
    def epoch():
        jpegs, y = fn.readers.file(files=files, labels=labels, name=READER, random_shuffle=False)
        mirror = 0
        if loader.train and augment.crop_flip:
            images = fn.decoders.image_random_crop(
                jpegs,
                device=decoder,
                output_type=types.RGB,
                adjust_orientation=False,  # EXIF orientation left as the torch loader's decoders leave it
                random_area=list(augment.crop_scale),
                random_aspect_ratio=list(CROP_RATIO),
                num_attempts=10,
            )
            side = loader.image_size
            images = fn.resize(images, resize_x=side, resize_y=side, antialias=True)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            side = loader.image_size if loader.train else augment.eval_size(loader.image_size)
            short = (
                int(round(loader.image_size * augment.eval_resize_ratio))
                if loader.train
                else augment.eval_resize(loader.image_size)
            )
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB, adjust_orientation=False)
            images = fn.crop(fn.resize(images, resize_shorter=short, antialias=True), crop=(side, side))
        if policy:
            images = _policy(images, augment, side)
        normalize = {} if loader.keep_uint8 else {
            "mean": [m * 255 for m in IMAGENET_MEAN],
            "std": [s * 255 for s in IMAGENET_STD],
        }  # fmt: skip
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.UINT8 if loader.keep_uint8 else types.FLOAT,
            output_layout="HWC" if loader.channels_last else "CHW",
            mirror=mirror,
            **normalize,
        )
        return images, (y.gpu() if decoder == "mixed" else y)  # labels beside the images: no host copy per step

    return epoch()


def _policy(images, augment: Augmentation, side: int):
    """data.augment_policy as DALI's own automatic augmentations (nvidia.dali.auto_aug), with
    torchvision's settings where the two differ: black fill, RandAugment's magnitude on the same 31
    bins and its translation up to 150/331 of the side, TrivialAugmentWide's up to 32 px."""
    from nvidia.dali.auto_aug import auto_augment, rand_augment, trivial_augment  # lazy: optional ([dali] extra)

    if augment.policy == "randaugment":
        return rand_augment.rand_augment(
            images,
            n=augment.num_ops,
            m=augment.magnitude,
            num_magnitude_bins=31,
            shape=(side, side),
            max_translate_rel=150 / 331,
            fill_value=0,
        )
    if augment.policy == "trivialaugment":
        return trivial_augment.trivial_augment_wide(images, num_magnitude_bins=31, max_translate_abs=32, fill_value=0)
    # "reduced_image_net": the ImageNet policy torchvision's AutoAugment has (DALI's "image_net" is the
    # EfficientNet one, with translations torchvision's policy does not have)
    return auto_augment.auto_augment(images, policy_name="reduced_image_net", fill_value=0)  # no translations: no shape
