"""The bottleneck doctor: from what a run measured, name where the time went and which flags to try.

It follows the tuning literature's decision tree, with the numbers this run measured:

1. input pipeline: a large share of training time blocked in the data loader's ``__next__`` (data
   wait) means the model is starved; more loader workers help until the CPU is saturated, then
   decode work must shrink. Only loader time counts here (see ``callbacks.step_clock``): time spent
   moving or decoding a batch on the device is transfer, and callbacks or logging are neither.
2. host-device transfer: a large share of training time moving batches to the device and preparing
   them there (``transfer_fraction``: copy, nvJPEG decode, uint8 normalize), or on a GPU a profile
   whose device time is dominated by host-to-device copies.
3. CPU-side overhead / sync points: on a GPU, low utilization while data is ready means the host
   cannot launch work fast enough (small batches, Python overhead, syncs).
4. memory: device memory nearly full (trade compute for memory), or mostly empty (grow the batch).
5. shared cores (CPU runs): loader workers and the training step together fill the cores, so what
   the workers take the step's threads lose; whether workers pay is then a measurement, not a rule.
6. compute: none of the above: the model's own math is the limit; the flags that make the math
   cheaper (amp, channels_last, compile, tf32) are what is left, where this hardware benefits.

Before all of these: unknown, where no whole training epoch was timed (nothing to read). With
several ranks the readings are rank 0's, and a note says so.

It reads no loader code: what it needs to know besides the measurements (whether DALI is installed,
whether the data is read from an object store) the caller tells it (``Facts``).

It also checks the hardware against the flags (emulated bf16, TF32 or compile on GPUs that cannot
benefit) and warns when other processes competed for the CPU during the run. Only flags that exist
are suggested. The verdict goes into metrics.json under ``diagnosis`` and the report's
``bottleneck`` column.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from trainer.doctor.facts import Facts, dali_takes
from trainer.doctor.feeding import feeding

INPUT_BOUND = 0.25  # data wait share of training time above which the input pipeline is the bottleneck
TRANSFER_BOUND = 0.15  # host-to-device copy share of device time (profile=true)
TRANSFER_FRACTION_BOUND = 0.20  # transfer share of training time (every run)
LOW_GPU_UTIL = 60.0  # percent
MEMORY_FULL = 0.90
MEMORY_ROOMY = 0.50
SHARED_CORES_MIN = 0.2  # cores the loader workers of a CPU run use before "shared cores" can be the verdict


def _flag_on(flags: Dict[str, Any], key: str) -> bool:
    return bool(flags.get(key)) and flags.get(key) not in ("auto", "none", 1)


def diagnose(
    *,
    metrics: Dict[str, Any],
    system: Dict[str, float],
    hardware: Dict[str, Any],
    flags: Dict[str, Any],
    data: Dict[str, Any],
    is_convnet: bool,
    h2d_share: Optional[float] = None,
    device_memory_mb: Optional[float] = None,
    processes_per_node: int = 1,
    world_size: int = 1,
    loader_rates: Optional[Dict[str, float]] = None,
    facts: Facts = Facts(),
) -> Dict[str, Any]:
    """``processes_per_node``: the ranks sharing this node's cores (torchrun's); ``world_size``: all ranks.
    The readings are this process's (rank 0's): the verdict says so where there are other ranks.
    ``loader_rates``: this machine's images per core-second of each decoder and of DALI, measured with
    the model out of the way (``trainer.measure.loader_rates``), or None where never measured here.
    ``facts``: what else it is told (``Facts``)."""
    # why longer: the verdict is a list of rules read top to bottom (the first that holds wins), all
    # reading the same evidence; split across functions, the order that decides would be hidden
    timed = metrics.get("data_wait_fraction") is not None  # a whole training epoch was timed
    wait = metrics.get("data_wait_fraction") or 0.0
    transfer = metrics.get("transfer_fraction") or 0.0
    cores = int(hardware.get("cpu_cores") or 1)
    cuda = hardware.get("accelerator") == "cuda"
    busy = system.get("cpu_busy_cores")
    gpu_util = system.get("gpu/util")
    # the allocator's reservation is what fills the device (allocated memory understates it)
    peak = metrics.get("peak_memory_reserved_mb") or metrics.get("peak_memory_mb")
    # the workers the run used (metrics.json's num_workers: data.auto_workers picks its own), else the config's
    used = metrics.get("num_workers")
    workers = int(used if used is not None else (data.get("num_workers") or 0))
    evidence = {
        "data_wait_fraction": round(wait, 3) if timed else None,
        "transfer_fraction": round(transfer, 3) if metrics.get("transfer_fraction") is not None else None,
        "cpu_busy_cores": busy,
        "cpu_cores": cores,
        "process_cpu_cores": system.get("process_cpu_cores"),
        "main_process_cpu_cores": system.get("main_process_cpu_cores"),
        "gpu_util": gpu_util,
        "h2d_share": h2d_share,
        "memory_used_fraction": round(peak / device_memory_mb, 3) if (peak and device_memory_mb) else None,
    }
    own = system.get("process_cpu_cores")  # this run's processes: main + loader workers (+ local ranks)
    quota = hardware.get("cpu_quota")
    if quota is not None and own is not None:
        # under a quota the allowed CPUs are shared by design: say what this run itself used
        busy_text = f"this run using {own:.1f} of its {quota:g}-core quota"
    else:
        busy_text = f"{busy:.1f} of {cores} cores busy" if busy is not None else f"{cores} cores"
    hw_notes = hardware_notes(hardware, flags)
    # busy is measured on the CPUs this run may use; under a cgroup quota those CPUs are shared
    # by design and the quota, not other processes, bounds the run: no verdict on competition there
    if busy is not None and own is not None and quota is None:
        others = busy - own
        if others > max(0.75, 0.4 * cores):
            hw_notes.append(
                f"other processes kept about {others:.1f} of {cores} cores busy during this run: its epoch times are "
                "inflated and not comparable; measure on a quiet machine."
            )

    dali = data.get("loader") == "dali"  # its threads decode inside the training process; no workers, no pinning
    if dali and not cuda:
        hw_notes.append(
            "data.loader=dali on a CPU: DALI's decoding threads run inside the training process, so its busy cores "
            "include the decoding; -m data.loader=torch,dali measures what they cost the step."
        )
    if world_size > 1:
        hw_notes.append(
            f"with {world_size} processes, the data wait and transfer shares are rank 0's own: a rank that waits "
            "longer for its data shows here only as time rank 0 spends waiting for it in the gradient all-reduce."
        )
    if not timed:
        text = (
            "no whole training epoch was timed (every epoch was cut short: stopped inside the first one, by "
            "stop_at_acc or a signal, or resumed inside the only one), so where the time went was not measured: "
            "train at least one whole epoch for a verdict."
        )
        return _verdict("unknown", text, [], hw_notes, evidence)
    if wait >= INPUT_BOUND:
        suggestions: List[str] = []
        # more workers (DALI threads) help until this run's own processes fill the cores
        saturated = own is not None and own >= 0.85 * cores
        from trainer.measure.hardware import workers_per_process

        more = max(1, workers_per_process(cores, processes_per_node))  # data.auto_workers's count
        # (never the count the run already has; data.auto_workers sets its own count over data.num_workers)
        if workers < more and not saturated and not data.get("auto_workers"):
            suggestions += [f"data.num_workers={more}"]
        if not saturated and not dali and not data.get("persistent_workers"):
            suggestions += ["data.persistent_workers=true"]
        if cuda and not data.get("pin_memory") and not dali:
            suggestions.append("data.pin_memory=true")
        suggestions += decode_suggestions(data, cuda, facts)
        if facts.data_remote and not data.get(
            "cache"
        ):  # every sample (or block) a request to the store: copy it once, read locally after
            suggestions.insert(0, "data.cache=DIR")
            why = (
                "data.root is read from an object store, a request per sample or block: copy it to "
                "local disk once with data.cache=DIR (checksummed, shared by the ranks of a node)"
            )
        elif saturated:
            why = (
                "the CPU is saturated, so more workers will not help: make each sample cheaper to load (smaller "
                "stored images, less augmentation) or use more cores; data=synthetic shows the model's own ceiling"
            )
        else:
            why = "the model waits for data"
        heavy = heavy_augmentation(data)
        if heavy:
            why += (
                f"; each image's augmentation ({', '.join(heavy)}) is part of that load: the row +bench=plain_augment "
                "(crop + flip only) measures what it costs"
            )
        loaders = f"{max(1, workers)} DALI threads" if dali else f"{workers} loader workers"
        if processes_per_node > 1:
            loaders += f" per process ({processes_per_node} on this node)"
        text = f"{wait:.0%} of training time waiting for the next batch with {busy_text} and {loaders}: {why}."
        fed = feeding(metrics, system, cores, data, loader_rates, facts) if cuda and processes_per_node == 1 else None
        if fed is not None:  # the loaders measured to feed it first; those measured not to, left out
            more, feeders, short, numbers = fed
            text += " " + more
            evidence.update(numbers)
            suggestions = feeders + [s for s in suggestions if s not in feeders and s not in short]
        return _verdict("input pipeline", text, suggestions, hw_notes, evidence)

    if transfer >= TRANSFER_FRACTION_BOUND or (cuda and h2d_share is not None and h2d_share >= TRANSFER_BOUND):
        return _verdict(
            "host-device transfer", *_transfer_advice(transfer, h2d_share, cuda, data, facts), hw_notes, evidence
        )

    if cuda and gpu_util is not None and gpu_util < LOW_GPU_UTIL:
        cap = float(hardware.get("capability") or 0)
        # torch.compile's GPU code needs sm70; reduce-overhead (CUDA graphs) is inductor's mode
        compiles = cap >= 7.0 and flags.get("compile_backend", "inductor") == "inductor"
        suggestions = [
            s
            for s, on in (
                ("compile=true", flags.get("compile") or not compiles),
                # max-autotune captures CUDA graphs too
                (
                    "compile_mode=reduce-overhead",
                    flags.get("compile_mode") in ("reduce-overhead", "max-autotune") or not compiles,
                ),
                ("data.batch_size=auto", flags.get("data.batch_size") == "auto"),
            )
            if not on
        ]
        text = (
            f"the GPU is busy only {gpu_util:.0f}% of the time while data is ready ({wait:.0%} data wait): "
            "the host cannot launch work fast enough (Python overhead, small kernels, sync points)."
        )
        return _verdict("CPU-side overhead", text, suggestions, hw_notes, evidence)

    used = evidence["memory_used_fraction"]
    if cuda and used is not None and used >= MEMORY_FULL:
        suggestions = [
            s
            for s, key in (("activation_checkpointing=true", "activation_checkpointing"), ("amp=true", "amp"))
            if not flags.get(key)
        ]
        text = f"the run peaked at {used:.0%} of device memory: memory limits the batch size; trade compute for memory."
        return _verdict("memory", text, suggestions, hw_notes, evidence)

    main = system.get("main_process_cpu_cores")  # the training process alone (absent under a launcher)
    if not cuda and workers and own is not None and main is not None and own >= 0.85 * cores:
        loader = max(0.0, own - main)
        if loader >= SHARED_CORES_MIN:
            text = (
                f"the {workers} loader worker{'s' if workers > 1 else ''} and the training step compete for the "
                f"{cores} cores ({busy_text}): the workers used {loader:.1f} and the step {main:.1f} of them, and "
                f"{wait:.0%} of training time waits for data. Each core's worth of decoding the workers do is taken "
                f"from the step's threads (it ran {metrics.get('intra_op_threads') or '?'} intra-op thread(s), the cores "
                f"the workers leave), so on this machine the workers pay only if they save the step more than "
                f"that: measure both with -m data.num_workers=0,{workers}, and make each sample cheaper to load."
            )
            suggestions = ["data.num_workers=0"] + decode_suggestions(data, cuda, facts)
            return _verdict("shared cores", text, suggestions, hw_notes, evidence)

    suggestions = compute_suggestions(flags, hardware, is_convnet)
    if cuda and used is not None and used < MEMORY_ROOMY and flags.get("data.batch_size") != "auto":
        suggestions.append("data.batch_size=auto")
    where = (
        f"the GPU ({gpu_util:.0f}% busy)"
        if (cuda and gpu_util is not None)
        else ("the GPU" if cuda else f"the CPU ({busy_text})")
    )
    text = f"only {wait:.0%} of training time waits for data: {where} spends the time on the model's own math."
    idle = _idle_core_note(metrics, system, cores, workers, cuda, own, main)
    if idle:
        text += " " + idle
        suggestions.append("data.num_workers=0")
    if not suggestions:
        text += " The math-cheapening flags that pay off on this hardware are already on."
    return _verdict("compute", text, suggestions, hw_notes, evidence)


def _idle_core_note(metrics, system, cores: int, workers: int, cuda: bool, own, main) -> Optional[str]:
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


def _transfer_advice(
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


def _verdict(
    bottleneck: str, text: str, suggestions: List[str], notes: List[str], evidence: Dict[str, Any]
) -> Dict[str, Any]:
    advice = f" Try: {' '.join(suggestions)}" if suggestions else ""
    return {
        "bottleneck": bottleneck,
        "verdict": f"{bottleneck}: {text}{advice}",
        "try": suggestions,
        "hardware": notes,
        "evidence": evidence,
    }
