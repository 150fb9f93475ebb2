"""What the tuner may try: each candidate is a named set of overrides, grouped by the bottleneck it
addresses, with the reason it is skipped where this hardware or this data cannot use it.

The groups follow the doctor's verdicts (``trainer.doctor``): an input-bound run gets the loader
candidates first, a transfer-bound one the copy candidates, a compute-bound one the flags that make
the math cheaper, and memory headroom a larger batch. A candidate is skipped, with the reason said
in the report, where it cannot pay off here (bf16 without native support, fp16 or pinned memory on
a CPU, cuDNN flags without CUDA), rather than measured to no purpose.
"""

from __future__ import annotations

import importlib.util
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import yaml

from trainer.launch import processes

INPUT, TRANSFER, COMPUTE, MEMORY, EPOCHS, EXTRA = (
    "input pipeline",
    "host-device transfer",
    "compute",
    "memory",
    "epochs to target",
    "your candidates",
)

# the doctor's bottleneck -> the groups to try, most relevant first (the rest follow while budget lasts)
ORDER = {
    "input pipeline": [INPUT, TRANSFER, COMPUTE, MEMORY],
    "host-device transfer": [TRANSFER, INPUT, COMPUTE, MEMORY],
    "CPU-side overhead": [COMPUTE, MEMORY, INPUT, TRANSFER],
    "memory": [COMPUTE, MEMORY, INPUT, TRANSFER],
    "compute": [COMPUTE, MEMORY, INPUT, TRANSFER],
    "shared cores": [INPUT, COMPUTE, MEMORY, TRANSFER],
}

IMAGE_FILES = ("imagefolder", "builtin", "imagenette")  # data that is decoded from JPEG/PNG files
ENCODED = IMAGE_FILES + ("parquet", "webdataset")  # encoded images, in files or in shards


@dataclass(frozen=True)
class Context:
    """What decides whether a candidate can pay off: the hardware and the run's own settings."""

    cuda: bool
    bf16_native: bool
    capability: float
    cores: int
    data_name: str
    allocators: tuple  # installed malloc replacements
    objective: str = "epoch_time"  # tune.objective

    @classmethod
    def of(cls, hw, cfg) -> "Context":
        """This machine (``hardware.detect``'s answer) and the run's data."""
        return cls(
            cuda=hw.accelerator == "cuda",
            bf16_native=hw.bf16_native,
            capability=float(hw.capability or 0),
            cores=hw.cpu_cores,
            data_name=str(cfg.data.name),
            allocators=allocators_installed(),
            objective=str(cfg.tune.objective),
        )


@dataclass(frozen=True)
class Candidate:
    name: str
    group: str
    overrides: tuple
    skip: Callable[[Context, Dict[str, Any]], Optional[str]] = lambda ctx, cfg: None
    needs: tuple = ()  # names of candidates that must be kept first (compile modes need compile)


def _cuda_only(what: str) -> Callable:
    return lambda ctx, cfg: None if ctx.cuda else f"{what}; this run is on a CPU"


def _image_files(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    return None if ctx.data_name in IMAGE_FILES else f"data={ctx.data_name} decodes no image files"


def _encoded(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    return None if ctx.data_name in ENCODED else f"data={ctx.data_name} decodes no images"


def _nvjpeg(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    return _cuda_only("nvJPEG decodes on the GPU")(ctx, cfg) or _image_files(ctx, cfg)


def _workers(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if (cfg.get("data.num_workers") or 0) > 0 or cfg.get("data.auto_workers"):
        return f"the loader already has workers (data.num_workers={cfg.get('data.num_workers')})"
    return None if ctx.cores > 1 else "one usable core: loader workers would compete with training for it"


def _prefetch(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if not cfg.get("data.num_workers") and not cfg.get("data.auto_workers"):
        return "prefetch_factor needs loader workers (none set or kept yet)"
    return None


def _amp(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.cuda or ctx.bf16_native:
        return None
    return "this CPU has no native bf16 (no AVX512-BF16/AMX): emulated bf16 is slower than fp32, and fp16 needs CUDA"


def _tf32(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if not ctx.cuda:
        return "TF32 is a GPU format; this run is on a CPU"
    return None if ctx.capability >= 8.0 else f"this GPU (sm{ctx.capability:g}) has no TF32"


def _inductor_mode(what: str) -> Callable:
    """A compile_mode candidate: a mode of Inductor's, on a GPU."""

    def skip(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
        backend = cfg.get("compile_backend") or "inductor"
        if backend != "inductor":
            return f"compile_mode is a mode of the inductor backend; this run has compile_backend={backend}"
        return _cuda_only(what)(ctx, cfg)

    return skip


def _compile(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.cuda and ctx.capability < 7.0:
        return f"torch.compile's GPU backend needs sm70 or newer; this GPU is sm{ctx.capability:g}"
    return None


def _allocator(name: str) -> Callable:
    def skip(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
        if name not in ctx.allocators:
            return (
                f"{name} is not installed (Debian: {'libjemalloc2' if name == 'jemalloc' else 'libtcmalloc-minimal4'})"
            )
        return None if cfg.get("runtime.allocator", "default") == "default" else "another allocator is already set"

    return skip


def _bigger_batch(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if not ctx.cuda:
        return "on a CPU the batch is not limited by device memory; batch_size=auto would grow it to gigabytes of RAM"
    return None if cfg.get("data.batch_size") != "auto" else "already on"


def _decode_scale(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.data_name not in ENCODED:
        return f"data={ctx.data_name} decodes no images"
    decoder = cfg.get("data.decoder", "pil")
    return (
        None if decoder in ("pil", "turbo") else f"data.decoder={decoder} has no reduced-size decode (pil and turbo do)"
    )


def _epochs(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.objective != "time_to_target":
        return "it changes how many epochs reach the accuracy, which epoch time does not see: tried with tune.objective=time_to_target"
    return None


def _turbo(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.data_name not in ENCODED:
        return f"data={ctx.data_name} decodes no images"
    return None if importlib.util.find_spec("simplejpeg") else "needs simplejpeg (pip install simplejpeg)"


def _torch_loader(skip: Callable) -> Callable:
    """A candidate of the torch loader's (its decoders, cache, workers' prefetch, the device copy): skipped
    once data.loader=dali is set or kept, since DALI then reads, decodes and hands over the batches."""

    def skip_under_dali(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
        if cfg.get("data.loader") == "dali":
            return "data.loader=dali reads, decodes and hands over the batches itself"
        if ctx.data_name == "synthetic" and cfg.get("data.device_resident"):
            return (
                "synthetic batches are gathered where the model trains (data.device_resident=true): no loader to tune"
            )
        return skip(ctx, cfg)

    return skip_under_dali


def _dali(ctx: Context, cfg: Dict[str, Any]) -> Optional[str]:
    if ctx.data_name not in IMAGE_FILES:
        return f"data={ctx.data_name} is not a folder of image files, which is what DALI's file reader reads"
    if (cfg.get("data.random_erasing") or 0) > 0:
        return "DALI has no operator that draws random erasing's boxes as torchvision does"
    from trainer.data.dali import installed  # lazy: the DALI module imports torch; the tuner's own process does not

    return None if installed() else "NVIDIA DALI is not installed (pip install 'trainer-switchboard[dali]')"


CATALOGUE: List[Candidate] = [
    # input pipeline
    Candidate("workers", INPUT, ("data.auto_workers=true", "data.persistent_workers=true"), _torch_loader(_workers)),
    Candidate("decoder_torchvision", INPUT, ("data.decoder=torchvision",), _torch_loader(_encoded)),
    Candidate("decoder_turbo", INPUT, ("data.decoder=turbo",), _torch_loader(_turbo)),
    # decode, crop and normalize in DALI's own threads (nvJPEG on a GPU), a thread per core the workers would use
    Candidate("dali", INPUT, ("data.loader=dali", "data.auto_workers=true"), _dali),
    Candidate("cache_in_memory", INPUT, ("data.cache_in_memory=true",), _torch_loader(_image_files)),
    Candidate("decode_scale", INPUT, ("data.decode_scale=auto",), _torch_loader(_decode_scale)),
    # needs loader workers, kept by the tuner or set by the user (data.num_workers): _prefetch says which
    Candidate("prefetch", INPUT, ("data.prefetch_factor=4",), _torch_loader(_prefetch)),
    Candidate(
        "gpu_normalize",
        INPUT,
        ("data.gpu_normalize=true",),
        _torch_loader(_cuda_only("it moves normalization from the loader to the GPU")),
    ),
    # host-device transfer
    Candidate(
        "pin_memory",
        TRANSFER,
        ("data.pin_memory=true",),
        _torch_loader(_cuda_only("pinned memory speeds host-to-GPU copies")),
    ),
    Candidate(
        "device_prefetch",
        TRANSFER,
        ("data.device_prefetch=true",),
        _torch_loader(_cuda_only("it overlaps the copy to the GPU on a CUDA stream")),
    ),
    Candidate("decoder_nvjpeg", TRANSFER, ("data.decoder=nvjpeg",), _torch_loader(_nvjpeg)),
    # compute
    Candidate("amp", COMPUTE, ("amp=true",), _amp),
    Candidate("channels_last", COMPUTE, ("channels_last=true",)),
    Candidate("compile", COMPUTE, ("compile=true",), _compile),
    Candidate(
        "compile_max_autotune",
        COMPUTE,
        ("compile_mode=max-autotune",),
        _inductor_mode("max-autotune tunes GPU kernels"),
        needs=("compile",),
    ),
    Candidate(
        "compile_reduce_overhead",
        COMPUTE,
        ("compile_mode=reduce-overhead",),
        _inductor_mode("reduce-overhead uses CUDA graphs"),
        needs=("compile",),
    ),
    Candidate("cudnn_benchmark", COMPUTE, ("cudnn_benchmark=true",), _cuda_only("cuDNN autotuning is a GPU feature")),
    Candidate("tf32", COMPUTE, ("tf32=true",), _tf32),
    Candidate("fused_optimizer", COMPUTE, ("optim.fused=true",)),
    Candidate("jemalloc", COMPUTE, ("runtime.allocator=jemalloc",), _allocator("jemalloc")),
    Candidate("tcmalloc", COMPUTE, ("runtime.allocator=tcmalloc",), _allocator("tcmalloc")),
    # memory headroom: a larger batch, the learning rate scaled with it
    Candidate("bigger_batch", MEMORY, ("data.batch_size=auto", "lr_scaling=linear"), _bigger_batch),
    # fewer or cheaper epochs to the accuracy, each epoch not faster (ema) or faster but less learned
    # (progressive_resize): judged by the time to the target only
    Candidate("progressive_resize", EPOCHS, ("progressive_resize=true",), _epochs),
    Candidate("ema", EPOCHS, ("ema=true",), _epochs),
]

NAMES = [c.name for c in CATALOGUE]


def extra_candidates(extra: Dict[str, str]) -> List[Candidate]:
    """``tune.extra.NAME='k=v k2=v2'``: the user's own candidates, tried after the built-in ones."""
    return [Candidate(name, EXTRA, tuple(shlex.split(str(value)))) for name, value in (extra or {}).items()]


def allocators_installed() -> tuple:
    return tuple(name for name in ("jemalloc", "tcmalloc") if processes.find_allocator(name))


def settings_of(overrides: List[str]) -> Dict[str, Any]:
    """key -> value of a list of ``key=value`` overrides, values parsed like YAML scalars."""
    out: Dict[str, Any] = {}
    for ov in overrides:
        key, _, value = ov.partition("=")
        try:
            out[key.lstrip("+~")] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.lstrip("+~")] = value
    return out
