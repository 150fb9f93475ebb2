"""What the doctor suggests beside a verdict: the flags to try for each kind of bottleneck, and the
hardware's notes on the flags that ran. The rules that pick the verdict are ``diagnose``'s."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from trainer.doctor.facts import Facts, dali_takes

TRANSFER_BOUND = 0.15  # host-to-device copy share of device time (profile=true) that makes it the bottleneck


def _flag_on(flags: Dict[str, Any], key: str) -> bool:
    return bool(flags.get(key)) and flags.get(key) not in ("auto", "none", 1)


def idle_core_note(metrics, cores: int, workers: int, cuda: bool, own, main) -> Optional[str]:
    """A CPU run whose step runs the intra-op threads its workers leave while the workers use far less
    than their cores: those cores sit idle, and the step might use them (a measurement decides)."""
    threads = metrics.get("intra_op_threads")
    if cuda or not workers or own is None or main is None or not threads or threads >= cores:
        return None
    loader = max(0.0, own - main)
    if own >= 0.75 * cores or loader >= 0.5 * workers:
        return None
    return (
        f"The step ran {threads} intra-op thread(s), the cores its {workers} loader worker(s) leave, but the workers "
        f"used only {loader:.1f} cores and {cores - own:.1f} of {cores} sat idle: -m data.num_workers=0,{workers} "
        "measures whether the step should have every core instead."
    )


def transfer_advice(
    transfer: float, h2d_share: Optional[float], cuda: bool, data: Dict[str, Any], facts: Facts
) -> tuple:
    """(text, suggestions) for a run whose batches take long to reach the device and be prepared there."""
    if (
        cuda
        and data.get("decoder") == "nvjpeg"
        and data.get("loader", "torch") == "torch"
        and not (h2d_share is not None and h2d_share >= TRANSFER_BOUND)
    ):
        # the batches cross the bus still encoded (a few kB each), already uint8 and pinned: what takes
        # the time is the decode and the per-image transforms after it (an H100: 60% of training time
        # at 1,181 images/s, with the batches prefetched)
        suggestions = [] if data.get("device_prefetch") else ["data.device_prefetch=true"]
        if dali_takes(data, facts):
            suggestions.append("data.loader=dali")
        text = (
            f"decoding the JPEGs on the GPU (nvJPEG) and cropping, flipping and resizing them there takes {transfer:.0%} "
            "of training time: the GPU spends it on the input, not the model. data.loader=dali decodes only each "
            "crop's region and runs the batch in a pipeline of its own; data.decoder=turbo with loader workers moves "
            "the work to the CPU's cores instead."
        )
        return text, suggestions
    if cuda:
        # DALI's pipeline copies and prefetches on its own (no pinning or prefetch of ours applies to it)
        torch_loader = data.get("loader", "torch") != "dali"
        own_loader = ("pin_memory", "gpu_normalize", "device_prefetch") if torch_loader else ("gpu_normalize",)
        suggestions = [f"data.{k}=true" for k in own_loader if not data.get(k)]
        if h2d_share is not None and h2d_share >= TRANSFER_BOUND:
            text = f"host-to-device copies take {h2d_share:.0%} of device time"
        else:
            text = f"moving batches to the GPU and preparing them there takes {transfer:.0%} of training time"
        return (
            text
            + ": the bus is the limit. Send fewer bytes per sample (smaller or uint8 images), copy from pinned memory and overlap the copy with compute.",
            suggestions,
        )
    # on a CPU there is no bus: the time is the work done on each batch after the loader
    # (transfer_batch_to_device / on_after_batch_transfer), in the training process, unparallelized
    suggestions = ["data.gpu_normalize=false"] if data.get("gpu_normalize") else []
    text = (
        f"preparing each batch after the loader (transfer_batch_to_device, on_after_batch_transfer) takes {transfer:.0%} of training time, "
        "in the training process itself: move that work into the dataset or the loader's workers, where it runs in parallel."
    )
    return text, suggestions


def heavy_augmentation(data: Dict[str, Any]) -> List[str]:
    """The per-image augmentation beyond crop + flip that a loader does for every image, as overrides."""
    out = []
    if data.get("augment_policy") not in (None, "none"):
        out.append(f"data.augment_policy={data['augment_policy']}")
    if (data.get("random_erasing") or 0) > 0:
        out.append(f"data.random_erasing={data['random_erasing']}")
    return out


def decode_suggestions(data: Dict[str, Any], cuda: bool, facts: Facts = Facts()) -> List[str]:
    """Cheaper per-sample loading for encoded images: a faster decoder, GPU decode, or no decode at all."""
    if data.get("name") not in ("imagefolder", "builtin", "imagenette", "parquet", "webdataset"):
        return []
    files = data.get("name") in ("imagefolder", "builtin", "imagenette")  # nvjpeg decodes image files (not shard bytes)
    if data.get("loader") == "dali":  # DALI decodes with its own decoder (nvJPEG on a GPU) and reads only files
        return []
    out = ["data.loader=dali"] if files and dali_takes(data, facts) else []  # decode and crop in DALI's own threads
    if cuda and files and data.get("decoder") != "nvjpeg":
        out.append("data.decoder=nvjpeg")
    elif (not cuda or not files) and data.get("decoder") in ("pil", None):
        out.append("data.decoder=turbo")
    out.append("data=packed")  # after python -m trainer.pack SRC DST
    return out


def compute_suggestions(flags: Dict[str, Any], hardware: Dict[str, Any], is_convnet: bool) -> List[str]:
    cuda = hardware.get("accelerator") == "cuda"
    cap = float(hardware.get("capability") or 0)
    out = []
    if not flags.get("amp") and (cuda or hardware.get("bf16_native")):
        out.append("amp=true")
    if is_convnet and not flags.get("channels_last") and (cuda or hardware.get("bf16_native") or flags.get("amp")):
        out.append("channels_last=true")
    if not flags.get("compile") and (not cuda or cap >= 7.0):
        out.append("compile=true")
    if cuda and cap >= 8.0 and not flags.get("tf32") and not flags.get("amp"):
        out.append("tf32=true")
    if cuda and is_convnet and not flags.get("cudnn_benchmark"):
        out.append("cudnn_benchmark=true")
    return out


def hardware_notes(hardware: Dict[str, Any], flags: Dict[str, Any]) -> List[str]:
    """What this hardware makes of the flags that are on (a flag that is off gets no note: the
    compute suggestions already leave out what would not pay off here)."""
    notes = []
    cuda = hardware.get("accelerator") == "cuda"
    cap = float(hardware.get("capability") or 0)
    if (
        not cuda
        and not hardware.get("bf16_native")
        and flags.get("amp")
        and flags.get("amp_dtype", "auto") in ("auto", "bf16")
    ):
        notes.append(
            "this CPU has no native bf16 (no AVX512-BF16/AMX): amp=true ran emulated bf16, usually slower than fp32."
        )
    if cuda and cap and cap < 8.0 and flags.get("amp") and flags.get("amp_dtype", "auto") != "fp16":
        if flags.get("amp_dtype", "auto") == "bf16":
            notes.append(
                f"this GPU (sm{hardware.get('capability')}) has no native bf16: amp_dtype=bf16 ran emulated, usually "
                "slower than fp32"
                + ("." if flags.get("strategy") == "fsdp2" else "; amp_dtype=auto picks fp16 with loss scaling here.")
            )
        else:
            notes.append(
                f"this GPU (sm{hardware.get('capability')}) has no native bf16: amp uses fp16 with loss scaling."
            )
    if cuda and cap and cap < 8.0 and flags.get("tf32"):
        notes.append(f"this GPU (sm{hardware.get('capability')}) has no TF32: tf32=true changes nothing.")
    if cuda and cap and cap < 7.0 and flags.get("compile"):
        notes.append(
            f"torch.compile's GPU backend (Triton) needs sm70 or newer; this GPU is sm{hardware.get('capability')}."
        )
    if not cuda and flags.get("tf32"):
        notes.append("tf32=true has no effect on a CPU.")
    return notes
