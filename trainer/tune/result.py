"""What the tuner reads from one run's metrics.json (a probe, a verification, a run to the target): its
steady epochs, its compile cost, its verdict, and its accuracy at each validation, from which its time
to a target val_acc follows (``Result.to_target``; within an epoch with ``report.val_per_epoch``, as
the report's ``time_to_target.reach`` counts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Dict, List, Optional

from trainer.measure import metrics as metrics_io
from trainer.measure.time_to_target import reaches


@dataclass
class Result:
    """What the tuner needs from one probe's (or verification's) metrics.json."""

    kind: str  # "probe", "verify", or "target" (trains until the target val_acc: tune.objective=time_to_target)
    config: List[str]  # the configuration's overrides (on top of the user's)
    dir: str
    status: str  # ok | failed
    error: Optional[str] = None
    steady: List[List[float]] = field(default_factory=list)  # [time_s, samples, fixed_s] of each measured epoch
    compile_s: float = 0.0
    bottleneck: Optional[str] = None
    verdict: Optional[str] = None
    val_acc: Optional[float] = None
    val_samples: Optional[int] = None
    epoch_samples: Optional[float] = None  # median samples of a training epoch
    wall_s: float = 0.0
    # each validation: [its epoch's training time up to it, val_acc or None, the epoch, the fraction of the
    # epoch done] (several per epoch with report.val_per_epoch); journals from before: [epoch time, val_acc]
    curve: List[list] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and (self.kind != "probe" or bool(self.steady))

    def to_target(self, target: float) -> Optional[List[float]]:
        """The training time of each epoch up to the first validation whose val_acc reaches ``target``, the
        last epoch's up to that validation (a part of it with report.val_per_epoch, as a run that
        stop_at_acc stops there trains); None if none did."""
        reached = self.reach(target)
        return reached[0] if reached else None

    def epochs_to_target(self, target: float) -> Optional[float]:
        """The epochs trained when a validation first reached ``target`` (1.5: half-way through the second)."""
        reached = self.reach(target)
        return reached[1] if reached else None

    def reach(self, target: float) -> Optional[tuple]:
        """(``to_target``'s times, ``epochs_to_target``'s epochs) from one pass over the curve; None if not reached."""
        times: dict = {}  # epoch -> its training time so far
        for n, point in enumerate(self.curve):
            time_s, acc = point[0], point[1]
            epoch, done = (point[2], point[3]) if len(point) > 3 else (n, 1.0)
            times[epoch] = time_s
            if reaches(acc, target):
                epochs = round(epoch + done, 4)
                return [times[e] for e in sorted(times)], int(epochs) if epochs == int(epochs) else epochs
        return None

    def epoch_times(self, full_samples: float, horizon_epochs: int) -> List[float]:
        """Each measured epoch as the time of a full epoch of the real run, compile time spread over the horizon.

        Only the steps scale with the epoch's length: its fixed cost (starting non-persistent loader
        workers and the first fetch, what follows the last step) is paid once per epoch, long or short.
        """
        out = []
        for record in self.steady:
            t, s = record[0], max(1.0, record[1])
            fixed = min(record[2], t) if len(record) > 2 else 0.0  # journals written before it was measured
            out.append(fixed + (t - fixed) / s * full_samples + self.compile_s / max(1, horizon_epochs))
        return out


def fixed_cost(epoch: Dict[str, Any]) -> float:
    """The part of an epoch outside its steps (EpochTimer's ``fixed_s``; 0 in records from before it was measured)."""
    return float(epoch.get("fixed_s") or 0.0)


def from_metrics(kind: str, config: List[str], run_dir: Path, wall_s: float, stderr: str) -> Result:
    path = run_dir / "metrics.json"
    if not path.exists():
        return Result(
            kind,
            config,
            str(run_dir),
            "failed",
            error=f"the run wrote no metrics.json ({last_lines(stderr) or 'no output'})",
            wall_s=wall_s,
        )
    m = metrics_io.read(str(path))
    epochs = sorted(
        (e for e in m.get("epochs", []) if e.get("time_s") and e.get("samples")), key=lambda e: e.get("epoch", 0)
    )
    steady = [[e["time_s"], e["samples"], fixed_cost(e)] for e in epochs if not e.get("warmup")]
    diagnosis = m.get("diagnosis") or {}
    return Result(
        kind,
        config,
        str(run_dir),
        m.get("status", "failed"),
        error=m.get("error"),
        steady=steady,
        # the compiler's per-process warm-up is part of what compiling costs a run (paid once, in setup_s)
        compile_s=float(m.get("compile_time_s") or 0.0) + float(m.get("compile_warmup_s") or 0.0),
        bottleneck=diagnosis.get("bottleneck"),
        verdict=diagnosis.get("verdict"),
        val_acc=m.get("val_acc"),
        val_samples=m.get("val_samples"),
        epoch_samples=median([e["samples"] for e in epochs]) if epochs else None,
        wall_s=wall_s,
        curve=[point for e in epochs for point in _validation_points(e)],
    )


def _validation_points(epoch: Dict[str, Any]) -> List[list]:
    """The epoch's ``Result.curve`` points: its training time up to each validation, plus what the process
    paid before it (the first epoch's setup_s: the compiler's warm-up, the first workers' start) and
    what its validations' compiling cost (val_compile_s): the report's time to target counts the same
    (time_to_target.with_elapsed). One point at the epoch's end, or one per validation within it
    (report.val_per_epoch), and then the epoch's end, validated or not."""
    i, setup = epoch.get("epoch", 0), float(epoch.get("setup_s") or 0.0)
    whole = epoch["time_s"] + setup + float(epoch.get("val_compile_s") or 0.0)
    points, paid = [], 0.0
    for v in epoch.get("validations") or []:
        paid += float(v.get("compile_s") or 0.0)
        done = v["fraction"] if v.get("fraction") is not None else 1.0
        points.append([setup + v["train_s"] + paid, v.get("val_acc"), i, done])
    if not points or (points[-1][3] < 1.0 and not epoch.get("partial")):
        points.append([whole, epoch.get("val_acc") if not points else None, i, 1.0])
    return points


def last_lines(text: Optional[str]) -> str:
    """The last lines of a run's stderr, short: why it failed, where its metrics.json does not say."""
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return " ".join(lines[-3:])[-400:]
