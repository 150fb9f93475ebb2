"""Which loader would feed an input-bound GPU run, from measured rates.

The model's rate with its data always ready is the run's rate over the share of time it did not wait;
the loader's rate per core is what its workers delivered per core they used (both measured in the
run). The other loaders' rates per core are this machine's data-only benchmark's
(``trainer.measure.loader_rates``, ``scripts/bench_loader_per_core.py --save``), scaled by the run's own
loader against the same benchmark's row for it, so that the comparison is on the run's images.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

from trainer.doctor.facts import Facts, dali_takes
from trainer.measure.hardware import workers_per_process

FEEDS = 0.9  # a loader feeds the model where it needs at most this share of the cores it may have


def feeding(
    metrics: Dict[str, Any],
    system: Dict[str, float],
    cores: int,
    data: Dict[str, Any],
    loader_rates: Optional[Dict[str, float]],
    facts: Facts = Facts(),
) -> Optional[tuple]:
    """Which loader would feed an input-bound GPU run: (text, the flags that feed it, the flags measured
    not to, the numbers), or None where this run did not measure its loader's CPU (no worker processes)."""
    rate, wait = metrics.get("samples_per_s"), metrics.get("data_wait_fraction") or 0.0
    own, main = system.get("process_cpu_cores"), system.get("main_process_cpu_cores")
    workers = int(metrics.get("num_workers") or 0)
    if not rate or wait >= 0.99 or own is None or main is None or not workers or data.get("loader") == "dali":
        return None
    loader_cores = own - main
    if loader_cores < 0.2:
        return None

    model = rate / (1 - wait)
    per_core = rate / loader_cores
    need = model / per_core
    spare = workers_per_process(cores)
    decoder = metrics.get("decoder")  # None: nothing is decoded (CIFAR-10's arrays, packed, synthetic)
    numbers = {
        "model_images_per_s": round(model, 1),
        "loader_images_per_core_s": round(per_core, 1),
        "loader_cores_needed": round(need, 2),
    }
    text = (
        f"With its data always ready the model would train {model:.0f} images/s; this loader ({decoder or 'no decode'}) "
        f"delivered {per_core:.0f} per core its workers used ({loader_cores:.1f} cores), so it needs {need:.1f} "
        f"cores of workers to keep up, of the {spare} this node leaves them"
    )
    if need <= FEEDS * spare:
        wanted = min(spare, max(workers + 1, math.ceil(need) + 1))  # a worker more than the cores needed: headroom
        if wanted <= workers:  # it has them: its workers wait on something other than their own CPU
            text += (
                f": its {workers} workers could, and used only {loader_cores:.1f} cores: they wait on something other "
                "than their CPU (reading the files, the hand-over to the training process), not on decoding."
            )
            return text, [], [], numbers
        return (
            text + f": more workers would feed it (data.num_workers={wanted}).",
            [f"data.num_workers={wanted}"],
            [],
            numbers,
        )
    others, feeders, short = _other_loaders(model, per_core, spare, decoder, data, loader_rates, facts)
    text += ": more workers cannot feed it" + "".join(f"; {o}" for o in others)
    if loader_rates is None and decoder:
        text += (
            " (the CPU decoders' rates per core on this machine: python scripts/bench_loader_per_core.py --save, "
            "and the doctor compares them)"
        )
    return text + ".", feeders, short, numbers


def _other_loaders(model, per_core, spare, decoder, data, loader_rates, facts) -> tuple:
    """The other loaders for the data: (what each would need, those that feed it, those measured not to)."""
    files = data.get("name") in ("imagefolder", "builtin", "imagenette")
    others, feeders, short = [], [], []
    if files and decoder not in ("nvjpeg", None):
        others.append("data.decoder=nvjpeg decodes on the GPU, its workers only read the files")
        feeders.append("data.decoder=nvjpeg")
    base = (loader_rates or {}).get(decoder) if decoder else None  # the decoders' alternatives, where one decodes
    for name, flag in (("turbo", "data.decoder=turbo"), ("dali", "data.loader=dali")):
        if name == decoder or not base or name not in loader_rates:
            continue
        if name == "dali" and not (files and dali_takes(data, facts)):
            continue
        theirs = per_core * loader_rates[name] / base
        needs = model / theirs
        feeds = needs <= FEEDS * spare
        others.append(f"{flag} about {theirs:.0f} per core, {needs:.1f} cores ({'enough' if feeds else 'not enough'})")
        (feeders if feeds else short).append(flag)
    return others, feeders, short
