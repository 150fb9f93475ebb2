"""How the report tells a difference from noise: a speed-up's bootstrap interval, an accuracy
drop's sampling noise, a row's spread of epoch times.

Apart from the rows they judge so that the statistics can be read (and tested) on their own, and
so that the tuner judges its probes with the same interval as the report (``speedup_interval``).
"""

from __future__ import annotations

import math
import random
import statistics
from typing import List, Optional

from trainer.report.jobs import Row

# Noise is judged from the data: a speedup's 95% interval comes from a bootstrap of the ratio of
# median steady epoch times (resampling each job's epochs, and the repeats of a folded row); a
# speedup whose interval contains 1.00x is "within noise". Seeded, so a report rebuilds identically.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def accuracy_noise(base_acc: float, base_n: Optional[int], acc: float, n: Optional[int]) -> Optional[float]:
    """Half-width of the 95% interval of a difference of two accuracies measured on n and base_n
    samples (normal approximation of two binomials): a smaller drop is within sampling noise."""
    if not base_n or not n:
        return None
    variance = base_acc * (1 - base_acc) / base_n + acc * (1 - acc) / n
    # an accuracy of exactly 0 or 1 still has the resolution of one sample
    variance = max(variance, 1 / base_n**2 + 1 / n**2)
    return 1.96 * math.sqrt(variance)


def speedup_interval(
    base: List[List[float]], other: List[List[float]], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> Optional[tuple]:
    """A bootstrap interval of median(base) / median(other) over steady epoch times.

    Each argument is a list of repeats, each a list of epoch times. A resample draws repeats with
    replacement, then epochs within each drawn repeat, and pools them (a hierarchical bootstrap:
    run-to-run variation counts, not only epoch-to-epoch). None when either side has fewer than
    two epochs in all: one number has no spread to judge.
    """
    if sum(len(r) for r in base) < 2 or sum(len(r) for r in other) < 2:
        return None
    rng = random.Random(seed)

    def draw(repeats: List[List[float]]) -> float:
        picked = rng.choices(repeats, k=len(repeats)) if len(repeats) > 1 else repeats
        pooled = [t for r in picked for t in rng.choices(r, k=len(r))]
        return statistics.median(pooled)

    ratios = sorted(draw(base) / draw(other) for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return ratios[int(tail * (resamples - 1))], ratios[int(round((1 - tail) * (resamples - 1)))]


def spread_of(row: Row) -> Optional[tuple]:
    """min-max of the steady epochs (one job), or of the repeats' medians (a folded row)."""
    if len(row.jobs) > 1:
        medians = [statistics.median(t) for t in row.samples()]
        return (min(medians), max(medians)) if len(medians) >= 2 else None
    times = row.first.steady_times()
    return (min(times), max(times)) if len(times) >= 2 else None
