"""What a run prints on the terminal: our lines, not our dependencies' chatter.

A single run prints a header (device, flags, lr), one line per epoch and the doctor's verdict; a
sweep prints one status line per job and the A/B table at the end. Everything still reaches the
run dir's ``train.log`` in full: the filter and formatter here sit on the console handler only
(Hydra builds both handlers from ``hydra.job_logging`` in configs/train.yaml, which names them).
"""

from __future__ import annotations

import logging
import os
import re
import textwrap
import warnings
from typing import Any, Dict, Iterable, List, Optional, Set

from trainer.measure.time_to_target import NOT_VALIDATED
from trainer.rank import global_rank, srun_task

# Lightning's INFO lines ("GPU available: ...", "TPU available: ...", the LitLogger tip, "Loading
# `train_dataloader` to estimate ...", "`Trainer.fit` stopped: ...") say nothing a user of this
# trainer needs: the header already names the device. They stay in train.log.
_CHATTY_LOGGERS = ("pytorch_lightning", "lightning", "lightning_fabric")

# Lightning's model summary is logged only when asked for (trainer.model_summary=true): let it through
_MODEL_SUMMARY_LOGGER = "pytorch_lightning.callbacks.model_summary"

# A record logged with extra={STATUS_LINE: True} is a sweep job's one line on the console.
STATUS_LINE = "trainer_status_line"

# Set for the processes a sweep job launches (its ranks, or a child for runtime.allocator): the
# sweep's own process prints the job's status line, so they stay as quiet as a sweep job (set_sweep).
QUIET_ENV = "TRAINER_QUIET_CONSOLE"

_state: Dict[str, Any] = {"sweep": False, "swept_keys": None, "warned": set()}


def set_sweep(on: bool, swept_keys: Optional[Iterable[str]] = None) -> None:
    """In a sweep the console shows only each job's status line, warnings (once each) and errors."""
    _state["sweep"] = on or os.environ.get(QUIET_ENV) == "1"
    if swept_keys is not None:
        _state["swept_keys"] = list(swept_keys)


def swept_keys(overrides: Iterable[str]) -> List[str]:
    """The keys a sweep varies: Hydra's sweep syntax (``a,b``, ``range(...)``, ``choice(...)``, ``glob(...)``);
    a list value (``logger=[csv,mlflow]``) is one value, not a sweep."""
    keys = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        value = value.strip()
        if not sep or (value.startswith("[") and value.endswith("]") and "],[" not in value.replace(" ", "")):
            continue
        if "," in value or re.match(r"^(range|choice|glob|interval)\(", value):
            keys.append(key.lstrip("+~"))
    return keys


class ConsoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, STATUS_LINE, False):
            return True
        if record.levelno < logging.ERROR and global_rank() != 0:
            return False  # the other ranks say the same as rank 0 (their logs are in the run dir)
        if record.levelno < logging.WARNING:
            if record.name.split(".", 1)[0] in _CHATTY_LOGGERS and record.name != _MODEL_SUMMARY_LOGGER:
                # ...except a fit that stopped early for a reason other than its planned length
                message = record.getMessage()
                return "stopped:" in message and not re.search(r"`max_(epochs|steps)=[-\d]+` reached", message)
            return not _state["sweep"]
        if _state["sweep"] and record.levelno == logging.WARNING:
            # the same warning from every job of a sweep ("bf16 is emulated here") is said once
            message = record.getMessage()
            warned: Set[str] = _state["warned"]
            if message in warned:
                return False
            warned.add(message)
        return True


class LauncherFilter(logging.Filter):
    """Hydra's launcher lists each job's overrides as it starts it; the job's status line says that."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.WARNING and record.getMessage().lstrip().startswith("#"))


class ConsoleFormatter(logging.Formatter):
    """Plain lines: the message, prefixed with its level only when it is a warning or worse."""

    def __init__(self) -> None:
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            return f"{record.levelname.lower()}: {text}"
        return text


_known_warnings_quieted = False


def quiet_known_warnings() -> None:
    """Filter third-party warnings we know are harmless, at their source, each with why."""
    global _known_warnings_quieted
    if _known_warnings_quieted:
        return
    _known_warnings_quieted = True
    # torch 2.14 deprecated ``isinstance(x, LeafSpec)``; Lightning 2.6's own pytree helper still
    # builds LeafSpec() (pytorch_lightning/utilities/_pytree.py). Lightning's bug to fix, not ours
    # nor the user's: nothing they can change.
    warnings.filterwarnings(
        "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
    )
    # Lightning warns when an epoch has fewer batches than log_every_n_steps: its own step logging
    # would write nothing in that epoch. The trainer writes step values itself (StepLoss: every
    # log_every_n_steps optimizer steps, across epochs), so nothing is lost and there is nothing to set.
    warnings.filterwarnings(
        "ignore", message=r"The number of training batches \(\d+\) is smaller than the logging interval"
    )
    if "SLURM_JOB_ID" not in os.environ or srun_task():
        # Lightning warns on every run that `srun` exists but is not used whenever Slurm's client is
        # installed. Outside a Slurm job that is a machine that merely has Slurm: not a mistake. In one
        # of srun's tasks srun was used; Lightning says otherwise where the job is named interactive or
        # bash (salloc's), which it reads as "not srun" (trainer.launch.slurm.srun_ranks_environment).
        warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system but is not used")


def job_label(num: Any, overrides: Iterable[str]) -> str:
    """``#2 amp=true channels_last=false``: the job's number and the values of what the sweep varies."""
    overrides = list(overrides)
    keys = _state["swept_keys"]
    shown = [_lower_bools(ov) for ov in overrides if keys is None or ov.partition("=")[0].lstrip("+~") in keys]
    return f"#{num} " + " ".join(shown) if shown else f"#{num}"


def _lower_bools(override: str) -> str:
    """Hydra's sweeper hands each job ``amp=False``; the command line (and the report) say ``amp=false``."""
    key, sep, value = override.partition("=")
    return f"{key}={value.lower()}" if sep and value in ("True", "False") else override


def status_line(num: Any, overrides: Iterable[str], result: Dict[str, Any], out_dir: str) -> str:
    """One line that says how a sweep job went."""
    label = job_label(num, overrides)
    if not result:
        return f"{label}: no metrics.json was written; see {out_dir}"
    if result.get("status") != "ok":
        return f"{label}: {result.get('status', 'failed')}: {result.get('error') or 'see its metrics.json'} ({out_dir})"
    parts = []
    if result.get("epoch_time_s") is not None:
        parts.append(f"{result['epoch_time_s']:.3f} s/epoch")
    if result.get("samples_per_s") is not None:
        parts.append(f"{result['samples_per_s']:.1f} samples/s")
    if result.get("val_acc") is not None:
        parts.append(f"val_acc {result['val_acc']:.3f}")
    bottleneck = (result.get("diagnosis") or {}).get("bottleneck")
    if bottleneck:
        parts.append(f"bottleneck: {bottleneck}")
    if result.get("already_finished"):
        parts.append("already finished, unchanged")
    return f"{label}: " + ", ".join(parts)


# The A/B table a sweep prints: the columns a person compares at a glance, no wider than this
# (ab_report.md and ab_report.csv keep every column and note)
TABLE_WIDTH = 120
_GAP = "  "
_NBSP = "\xa0"  # joins the parts of a cell that must not be wrapped apart ("1.36x [1.34-1.43]")
_DROP = re.compile(r"ACCURACY DROP [+-][\d.]+")


def ab_table(rows: List[Dict[str, Any]], varied: List[str], base_job: Optional[str], width: int = TABLE_WIDTH) -> str:
    """The A/B report's rows (``trainer.report.rows.build_rows``) as a plain-text table at most ``width``
    columns wide: the job, its configuration (what differs from the baseline), epoch time and
    speed-up with its interval, val_acc, time to target with its speed-up and interval, and the
    verdict (a failure or an accuracy drop first, then the doctor's bottleneck). A speed-up whose
    interval contains 1.00x says "within noise"; one without an interval says why ("(1 run)"), so
    no unjudged ratio reads like a judged one. Long cells wrap within their column."""
    base = next((r for r in rows if r.get("job") == base_job), None)
    to_target = any("time_to_target_s" in r for r in rows)
    headers = ["job", "configuration", "epoch\ntime", "epoch\nspeed-up", "val_acc"]
    if to_target:
        headers += ["time to\ntarget", "speed-up\nto target", "interval\nholds"]
    headers.append("verdict")
    table = [headers]
    for row in rows:
        ok = row.get("status") == "ok"
        cells = [
            str(row.get("job", "")),
            _configuration(row, varied, base),
            _seconds(row.get("epoch_time_s")) if ok else "-",
            _ratio(row.get("speedup"), row.get("speedup_ci"), row is base, "(not judged)"),
            f"{row['val_acc']:.3f}" if row.get("val_acc") is not None else "-",
        ]
        if to_target:
            reached = row.get("time_to_target_s")
            cells += [
                (_seconds(reached) + f", {row['epochs_to_target']:g}{_NBSP}ep" if reached is not None else "")
                or (
                    (NOT_VALIDATED if any(n.startswith(NOT_VALIDATED) for n in row_notes(row)) else "not reached")
                    if ok
                    else "-"
                ),
                _ratio(row.get("time_to_target_speedup"), row.get("time_to_target_ci"), row is base, one_run(row)),
                row.get("time_to_target_ci_holds") or "-",
            ]
        cells.append(_verdict(row))
        table.append(cells)
    return _layout(table, width, flexible=(1, len(headers) - 1, 0), right=(2, 4))


def one_run(row: Dict[str, Any]) -> str:
    """How a time-to-target ratio without an interval is marked: which side ran once."""
    return "(1 run)" if (row.get("repeats") or 1) == 1 else "(baseline: 1 run)"


def _configuration(row: Dict[str, Any], varied: List[str], base: Optional[Dict[str, Any]]) -> str:
    """The row's varied settings; for a row other than the baseline, only those that differ from it."""
    keys = [k for k in varied if base is None or row is base or row.get(k) != base.get(k)]
    if not keys:
        return "as the baseline"
    return " ".join(f"{k}={_value(row.get(k))}" for k in keys)


def _value(value: Any) -> str:
    """A setting as the command line gives it; a path by its last part (ab_report.md has it whole)."""
    if value is None:
        return "null"
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return "…/" + text.rstrip("/").rsplit("/", 1)[-1] if "/" in text.rstrip("/") else text


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}{_NBSP}s" if value < 10 else f"{value:.1f}{_NBSP}s"


def _ratio(value: Optional[float], ci: Optional[str], is_base: bool, unjudged: str) -> str:
    """A speed-up as judged: with its interval, "within noise" when that contains 1.00x, or marked unjudged."""
    if is_base:
        return "baseline"
    if value is None:
        return "-"
    if not ci:
        return f"{value:.2f}x{_NBSP}{unjudged.replace(' ', _NBSP)}"
    low, high = (float(x) for x in ci.split("-"))
    within = low <= 1.0 <= high
    # two decimals, or three where two would put a bound on the other side of 1.00 (1.004 is no 1.00)
    digits = 2 if (round(low, 2) <= 1.0 <= round(high, 2)) == within else 3
    text = f"{value:.2f}x{_NBSP}[{low:.{digits}f}-{high:.{digits}f}]"
    return text + (" within noise" if within else "")


def row_notes(row: Dict[str, Any]) -> List[str]:
    """An A/B report row's notes, each phrase apart (the row holds them "; "-joined, as its csv/md cell)."""
    return (row.get("notes") or "").split("; ")


def _verdict(row: Dict[str, Any]) -> str:
    if row.get("status") != "ok":
        error = str(row.get("error") or row.get("status") or "failed")
        return "FAILED: " + (error if len(error) <= 60 else error[:59] + "…")  # whole in ab_report.md
    parts = _DROP.findall(row.get("notes") or "")
    if row.get("bottleneck"):
        parts.append(str(row["bottleneck"]))
    return "; ".join(parts) or "-"


def _layout(table: List[List[str]], width: int, flexible: tuple, right: tuple = ()) -> str:
    """Rows of cells as aligned text no wider than ``width``: every column as wide as its longest
    cell, then the ``flexible`` ones (in that order), then any, narrowed until the table fits; a cell
    wider than its column wraps onto more lines."""
    columns = [[line for cell in column for line in cell.split("\n")] for column in zip(*table)]
    natural = [max(len(line) for line in column) for column in columns]
    # the longest part that does not wrap (words, split at plain spaces only: not at _NBSP)
    shortest = [max(len(word) for line in column for word in line.split(" ")) for column in columns]
    widths = list(natural)
    budget = width - len(_GAP) * (len(widths) - 1)

    def narrow(order, floor) -> None:
        for i in order:
            excess = sum(widths) - budget
            if excess <= 0:
                return
            widths[i] -= max(0, min(excess, widths[i] - floor(i)))

    narrow(flexible, lambda i: max(shortest[i], {1: 20, 0: 8}.get(i, 16)))
    fixed = [i for i in range(len(widths)) if i not in flexible]
    while sum(widths) > budget and any(widths[i] > shortest[i] for i in fixed):
        # wrap as few columns as it takes: the one with the most room first, as far as needed
        roomiest = max(fixed, key=lambda i: widths[i] - shortest[i])
        widths[roomiest] -= min(sum(widths) - budget, widths[roomiest] - shortest[roomiest])
    narrow(flexible, lambda i: shortest[i])
    narrow(flexible, lambda i: 6)  # words broken: a configuration of one very long key=value
    narrow(range(len(widths)), lambda i: 3)
    lines = []
    for n, cells in enumerate(table):
        wrapped = [
            [part for line in cell.split("\n") for part in textwrap.wrap(line, w, break_on_hyphens=False)] or [""]
            for cell, w in zip(cells, widths)
        ]
        for k in range(max(len(parts) for parts in wrapped)):
            texts = [(parts[k] if k < len(parts) else "").replace(_NBSP, " ") for parts in wrapped]
            padded = [t.rjust(w) if i in right and n else t.ljust(w) for i, (t, w) in enumerate(zip(texts, widths))]
            lines.append(_GAP.join(padded).rstrip())
        if n == 0:
            lines.append(_GAP.join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
