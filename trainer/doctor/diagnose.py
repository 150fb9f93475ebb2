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

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from trainer.doctor.advice import (
    TRANSFER_BOUND,
    compute_suggestions,
    decode_suggestions,
    hardware_notes,
    heavy_augmentation,
    idle_core_note,
    transfer_advice,
)
from trainer.doctor.facts import Facts
from trainer.doctor.feeding import feeding
from trainer.measure.hardware import workers_per_process

INPUT_BOUND = 0.25  # data wait share of training time above which the input pipeline is the bottleneck
TRANSFER_FRACTION_BOUND = 0.20  # transfer share of training time (every run)
LOW_GPU_UTIL = 60.0  # percent
MEMORY_FULL = 0.90
MEMORY_ROOMY = 0.50
SHARED_CORES_MIN = 0.2  # cores the loader workers of a CPU run use before "shared cores" can be the verdict


@dataclass
class Reading:
    """A run's measurements as the rules read them, with what the doctor was told beside them."""

    metrics: Dict[str, Any]
    system: Dict[str, float]
    hardware: Dict[str, Any]
    flags: Dict[str, Any]
    data: Dict[str, Any]
    facts: Facts
    loader_rates: Optional[Dict[str, float]]
    h2d_share: Optional[float]
    processes_per_node: int
    timed: bool  # a whole training epoch was timed
    wait: float
    transfer: float
    cores: int
    cuda: bool
    workers: int
    busy_text: str
    evidence: Dict[str, Any] = field(default_factory=dict)

    @property
    def own(self) -> Optional[float]:
        """This run's processes' CPU: main + loader workers (+ local ranks)."""
        return self.system.get("process_cpu_cores")

    @property
    def main(self) -> Optional[float]:
        """The training process alone (absent under a launcher)."""
        return self.system.get("main_process_cpu_cores")

    @property
    def dali(self) -> bool:
        """data.loader=dali: its threads decode inside the training process; no workers, no pinning."""
        return self.data.get("loader") == "dali"

    @classmethod
    def of(
        cls,
        metrics,
        system,
        hardware,
        flags,
        data,
        facts,
        loader_rates,
        h2d_share,
        device_memory_mb,
        processes_per_node,
    ):
        wait = metrics.get("data_wait_fraction") or 0.0
        transfer = metrics.get("transfer_fraction") or 0.0
        cores = int(hardware.get("cpu_cores") or 1)
        busy, own, quota = system.get("cpu_busy_cores"), system.get("process_cpu_cores"), hardware.get("cpu_quota")
        # the allocator's reservation is what fills the device (allocated memory understates it)
        peak = metrics.get("peak_memory_reserved_mb") or metrics.get("peak_memory_mb")
        # the workers the run used (metrics.json's num_workers: data.auto_workers picks its own), else the config's
        used = metrics.get("num_workers")
        if quota is not None and own is not None:
            # under a quota the allowed CPUs are shared by design: say what this run itself used
            busy_text = f"this run using {own:.1f} of its {quota:g}-core quota"
        else:
            busy_text = f"{busy:.1f} of {cores} cores busy" if busy is not None else f"{cores} cores"
        reading = cls(
            metrics=metrics,
            system=system,
            hardware=hardware,
            flags=flags,
            data=data,
            facts=facts,
            loader_rates=loader_rates,
            h2d_share=h2d_share,
            processes_per_node=processes_per_node,
            timed=metrics.get("data_wait_fraction") is not None,
            wait=wait,
            transfer=transfer,
            cores=cores,
            cuda=hardware.get("accelerator") == "cuda",
            workers=int(used if used is not None else (data.get("num_workers") or 0)),
            busy_text=busy_text,
        )
        reading.evidence = {
            "data_wait_fraction": round(wait, 3) if reading.timed else None,
            "transfer_fraction": round(transfer, 3) if metrics.get("transfer_fraction") is not None else None,
            "cpu_busy_cores": busy,
            "cpu_cores": cores,
            "process_cpu_cores": own,
            "main_process_cpu_cores": system.get("main_process_cpu_cores"),
            "gpu_util": system.get("gpu/util"),
            "h2d_share": h2d_share,
            "memory_used_fraction": round(peak / device_memory_mb, 3) if (peak and device_memory_mb) else None,
        }
        return reading


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
    """The verdict: the first of ``RULES`` that holds, else compute.

    ``processes_per_node``: the ranks sharing this node's cores (torchrun's); ``world_size``: all ranks.
    The readings are this process's (rank 0's): the verdict says so where there are other ranks.
    ``loader_rates``: this machine's images per core-second of each decoder and of DALI, measured with
    the model out of the way (``trainer.measure.loader_rates``), or None where never measured here.
    ``facts``: what else it is told (``Facts``)."""
    reading = Reading.of(
        metrics, system, hardware, flags, data, facts, loader_rates, h2d_share, device_memory_mb, processes_per_node
    )
    notes = _notes(reading, world_size)
    for rule in RULES:
        found = rule(reading)
        if found is not None:
            return _verdict(*found, notes, reading.evidence)
    return _verdict(*_compute(reading, is_convnet), notes, reading.evidence)


def _notes(r: Reading, world_size: int) -> List[str]:
    """What the verdict should be read with: the hardware against the flags, competition, DALI, ranks."""
    notes = hardware_notes(r.hardware, r.flags)
    busy = r.system.get("cpu_busy_cores")
    # busy is measured on the CPUs this run may use; under a quota (a cgroup's, a Slurm allocation) those
    # CPUs are shared by design and the quota, not other processes, bounds the run: no verdict on competition
    if busy is not None and r.own is not None and r.hardware.get("cpu_quota") is None:
        others = busy - r.own
        if others > max(0.75, 0.4 * r.cores):
            notes.append(
                f"other processes kept about {others:.1f} of {r.cores} cores busy during this run: its epoch times are "
                "inflated and not comparable; measure on a quiet machine."
            )
    if r.dali and not r.cuda:
        notes.append(
            "data.loader=dali on a CPU: DALI's decoding threads run inside the training process, so its busy cores "
            "include the decoding; -m data.loader=torch,dali measures what they cost the step."
        )
    if world_size > 1:
        notes.append(
            f"with {world_size} processes, the data wait and transfer shares are rank 0's own: a rank that waits "
            "longer for its data shows here only as time rank 0 spends waiting for it in the gradient all-reduce."
        )
    return notes


def _unknown(r: Reading) -> Optional[tuple]:
    if r.timed:
        return None
    text = (
        "no whole training epoch was timed (every epoch was cut short: stopped inside the first one, by "
        "stop_at_acc or a signal, or resumed inside the only one), so where the time went was not measured: "
        "train at least one whole epoch for a verdict."
    )
    return "unknown", text, []


def _input_pipeline(r: Reading) -> Optional[tuple]:
    if r.wait < INPUT_BOUND:
        return None

    data, suggestions = r.data, []
    saturated = r.own is not None and r.own >= 0.85 * r.cores  # more workers help until the run fills the cores
    more = max(1, workers_per_process(r.cores, r.processes_per_node))  # data.auto_workers's count
    # (never the count the run already has; data.auto_workers sets its own count over data.num_workers)
    if r.workers < more and not saturated and not data.get("auto_workers"):
        suggestions += [f"data.num_workers={more}"]
    if not saturated and not r.dali and not data.get("persistent_workers"):
        suggestions += ["data.persistent_workers=true"]
    if r.cuda and not data.get("pin_memory") and not r.dali:
        suggestions.append("data.pin_memory=true")
    suggestions += decode_suggestions(data, r.cuda, r.facts)
    if r.facts.data_remote and not data.get("cache"):  # a request to the store per sample or block
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
    loaders = f"{max(1, r.workers)} DALI threads" if r.dali else f"{r.workers} loader workers"
    if r.processes_per_node > 1:
        loaders += f" per process ({r.processes_per_node} on this node)"
    text = f"{r.wait:.0%} of training time waiting for the next batch with {r.busy_text} and {loaders}: {why}."
    fed = None
    if r.cuda and r.processes_per_node == 1:
        fed = feeding(r.metrics, r.system, r.cores, data, r.loader_rates, r.facts)
    if fed is not None:  # the loaders measured to feed it first; those measured not to, left out
        more_text, feeders, short, numbers = fed
        text += " " + more_text
        r.evidence.update(numbers)
        suggestions = feeders + [s for s in suggestions if s not in feeders and s not in short]
    return "input pipeline", text, suggestions


def _transfer(r: Reading) -> Optional[tuple]:
    h2d = r.h2d_share
    if r.transfer >= TRANSFER_FRACTION_BOUND or (r.cuda and h2d is not None and h2d >= TRANSFER_BOUND):
        return ("host-device transfer", *transfer_advice(r.transfer, h2d, r.cuda, r.data, r.facts))
    return None


def _cpu_overhead(r: Reading) -> Optional[tuple]:
    gpu_util = r.system.get("gpu/util")
    if not (r.cuda and gpu_util is not None and gpu_util < LOW_GPU_UTIL):
        return None
    flags = r.flags
    cap = float(r.hardware.get("capability") or 0)
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
        f"the GPU is busy only {gpu_util:.0f}% of the time while data is ready ({r.wait:.0%} data wait): "
        "the host cannot launch work fast enough (Python overhead, small kernels, sync points)."
    )
    return "CPU-side overhead", text, suggestions


def _memory(r: Reading) -> Optional[tuple]:
    used = r.evidence["memory_used_fraction"]
    if not (r.cuda and used is not None and used >= MEMORY_FULL):
        return None
    suggestions = [
        s
        for s, key in (("activation_checkpointing=true", "activation_checkpointing"), ("amp=true", "amp"))
        if not r.flags.get(key)
    ]
    text = f"the run peaked at {used:.0%} of device memory: memory limits the batch size; trade compute for memory."
    return "memory", text, suggestions


def _shared_cores(r: Reading) -> Optional[tuple]:
    own, main, workers = r.own, r.main, r.workers
    if r.cuda or not workers or own is None or main is None or own < 0.85 * r.cores:
        return None
    loader = max(0.0, own - main)
    if loader < SHARED_CORES_MIN:
        return None
    text = (
        f"the {workers} loader worker{'s' if workers > 1 else ''} and the training step compete for the "
        f"{r.cores} cores ({r.busy_text}): the workers used {loader:.1f} and the step {main:.1f} of them, and "
        f"{r.wait:.0%} of training time waits for data. Each core's worth of decoding the workers do is taken "
        f"from the step's threads (it ran {r.metrics.get('intra_op_threads') or '?'} intra-op thread(s), the cores "
        f"the workers leave), so on this machine the workers pay only if they save the step more than "
        f"that: measure both with -m data.num_workers=0,{workers}, and make each sample cheaper to load."
    )
    return "shared cores", text, ["data.num_workers=0"] + decode_suggestions(r.data, r.cuda, r.facts)


# the verdicts in the order they are tried: the first that holds is the run's (compute when none does)
RULES = (_unknown, _input_pipeline, _transfer, _cpu_overhead, _memory, _shared_cores)


def _compute(r: Reading, is_convnet: bool) -> tuple:
    suggestions = compute_suggestions(r.flags, r.hardware, is_convnet)
    used, gpu_util = r.evidence["memory_used_fraction"], r.system.get("gpu/util")
    if r.cuda and used is not None and used < MEMORY_ROOMY and r.flags.get("data.batch_size") != "auto":
        suggestions.append("data.batch_size=auto")
    if r.cuda:
        where = f"the GPU ({gpu_util:.0f}% busy)" if gpu_util is not None else "the GPU"
    else:
        where = f"the CPU ({r.busy_text})"
    text = f"only {r.wait:.0%} of training time waits for data: {where} spends the time on the model's own math."
    idle = idle_core_note(r.metrics, r.cores, r.workers, r.cuda, r.own, r.main)
    if idle:
        text += " " + idle
        suggestions.append("data.num_workers=0")
    if not suggestions:
        text += " The math-cheapening flags that pay off on this hardware are already on."
    return "compute", text, suggestions


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
