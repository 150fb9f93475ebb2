"""A sweep's jobs as the report reads them: the ``metrics.json`` records, each job's settings, the
settings the jobs vary, and the rows they fold into.

Every part of the report starts from the same rows and the same baseline: the table's numbers
(``rows``), the chart (``figure``) and the doctor's verdicts (``render``) fold the jobs here, so they
agree on which jobs are one configuration. What a setting is when a job's command line did not set it
is what the job ran with, from its own record (``Job.value``: the run dir's ``.hydra`` files, else
metrics.json); only where neither holds it, the schema's default (its "off" value), read from
``trainer.config`` once and only when needed.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from trainer.config import GROUPS, SCHEMA_KEYS, TrainSchema

# keys that say which repetition a job is (and how the repeats were made), not what it runs: jobs
# differing only in them fold into one row
REPEAT_KEYS = ("seed", "repeat", "repeat_seeds")
# overrides that are not settings of the job (where it writes, which job it is)
_IGNORED_OVERRIDE_PREFIXES = ("hydra.", "ckpt_path")
# where Hydra saves a run's config (the run rewrites config.yaml with what it ran: trainer.run.parts.save_config)
HYDRA_SUBDIR = ".hydra"
_MISSING = object()  # a key a record does not hold (None is a value a key can have)


@dataclass
class Job:
    path: Path
    metrics: Dict[str, Any]
    settings: Dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.metrics.get("status") == "ok"

    def value(self, key: str) -> Any:
        """What this job ran with for ``key``: its command line's value, else its own record's, else the
        schema default. A recipe or a config group sets keys its command line never names
        (``+recipe=resnet50`` trains at 224 px with no ``data.image_size=`` in sight): the default there
        would show two different runs as one configuration and their difference as a speed-up."""
        if key in self.settings:
            return self.settings[key]
        # the config first: metrics.json's own fields may share a key's name (its compile_cache is the
        # cache's state, cold or warm, not the setting); it answers where the run dir has no .hydra/
        for record in (self._run_config, self.metrics):
            found = _lookup(record, key)
            if found is not _MISSING and not isinstance(found, dict):
                return found
        return self._group_choices.get(key, off_value(key)) if key in GROUPS else off_value(key)

    @cached_property
    def _run_config(self) -> Dict[str, Any]:
        """The run dir's ``.hydra/config.yaml``: the config the run ran, resolved ({} where there is none)."""
        return _read_yaml(self.path / HYDRA_SUBDIR / "config.yaml")

    @cached_property
    def _group_choices(self) -> Dict[str, Any]:
        """Which file of each config group the run composed (``model: tiny``), from ``.hydra/hydra.yaml``."""
        choices = _lookup(_read_yaml(self.path / HYDRA_SUBDIR / "hydra.yaml"), "hydra.runtime.choices")
        return choices if isinstance(choices, dict) else {}

    def steady_times(self) -> List[float]:
        """Times of the full, non-warm-up epochs (the ones epoch_time_s is the median of)."""
        epochs = self.metrics.get("epochs") or []
        return [e["time_s"] for e in epochs if not e.get("warmup") and not e.get("partial") and e.get("time_s")]


@dataclass
class Row:
    """One configuration: a job, or several repeats of it (same settings but seed/repeat)."""

    jobs: List[Job]
    name: str = ""

    @property
    def first(self) -> Job:
        return self.jobs[0]

    @property
    def ok(self) -> bool:
        return all(j.ok for j in self.jobs)

    @property
    def settings(self) -> Dict[str, Any]:
        return self.first.settings

    def value(self, key: str) -> Any:
        """What the row's runs ran with for ``key`` (``Job.value``; they differ at most in seed/repeat)."""
        return self.first.value(key)

    def seeds(self) -> int:
        """How many different seeds the row's runs trained with (a job given no seed= ran its config's)."""
        return len({json.dumps(j.value("seed"), default=str) for j in self.jobs})

    def samples(self) -> List[List[float]]:
        """Steady epoch times per repeat (repeats with none left out)."""
        return [t for t in (j.steady_times() for j in self.jobs) if t]

    def epoch_time(self) -> Optional[float]:
        """The job's epoch_time_s; for repeats, the median of their pooled steady epochs (what speedup_ci resamples)."""
        if len(self.jobs) == 1:
            return self.first.metrics.get("epoch_time_s")
        pooled = [t for times in self.samples() for t in times]
        return round(statistics.median(pooled), 4) if pooled else None

    def median_of(self, key: str) -> Optional[float]:
        values = [j.metrics.get(key) for j in self.jobs if j.metrics.get(key) is not None]
        return round(statistics.median(values), 4) if values else None

    def val_samples(self) -> Optional[int]:
        """Validation samples behind the row's val_acc; None if a job did not record it. Repeats
        validate on the same samples and the row shows their median, so one job's count, not their sum."""
        counts = [j.metrics.get("val_samples") for j in self.jobs]
        return min(counts) if counts and all(counts) else None


def find_metrics(dirs: Sequence[str]) -> List[Path]:
    """metrics.json files in the given run dirs or sweep dirs (any depth), in a stable order.

    A dir that holds a metrics.json is a run dir: nothing below it is searched, because what lies
    there is the run's own (W&B keeps a copy of metrics.json under ``wandb/*/files/``, one per
    attempt, which would otherwise be rows of their own).

    A run named twice (``report A A``, or a sweep dir and one of its jobs) is one run: it is found
    once, where it was first given, so it counts once in its row and in the baseline's repeats."""
    found: List[Path] = []
    for d in dirs:
        p = Path(d)
        if p.is_file() and p.name == "metrics.json":
            found.append(p)
            continue
        runs = []
        for root, subdirs, files in os.walk(p):
            if "metrics.json" in files:
                runs.append(Path(root) / "metrics.json")
                subdirs[:] = []  # the run's own files
        found.extend(sorted(runs, key=lambda q: _natural_key(q.relative_to(p))))
    return _once_each(found)


def _once_each(paths: List[Path]) -> List[Path]:
    """``paths`` without the ones that resolve to a file already listed (in their order)."""
    seen = set()
    out = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            out.append(path)
    return out


def _natural_key(path: Path):
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def _lookup(record: Any, key: str) -> Any:
    """``record``'s value at the dotted ``key`` (``data.image_size`` in ``{"data": {"image_size": 224}}``), else _MISSING."""
    for part in key.split("."):
        if not isinstance(record, dict) or part not in record:
            return _MISSING
        record = record[part]
    return record


def _read_yaml(path: Path) -> Dict[str, Any]:
    """A YAML mapping from disk; {} where the file is missing or holds no mapping (a run dir without .hydra)."""
    import yaml  # lazy: keeps yaml out of python -m trainer.report's start-up

    try:
        found = yaml.safe_load(path.read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return found if isinstance(found, dict) else {}


def _parse_value(text: str) -> Any:
    try:
        import yaml  # lazy: keeps yaml out of python -m trainer.report's start-up

        return yaml.safe_load(text)
    except Exception:
        return text


def _settings(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """What this job was asked to run: its flags plus every key=value override it was given."""
    settings = dict(metrics.get("flags") or {})
    for ov in metrics.get("overrides") or []:
        if "=" not in ov:
            continue
        key, value = ov.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith(_IGNORED_OVERRIDE_PREFIXES):
            continue
        settings[key] = _parse_value(value)
    settings.setdefault("recipe", metrics.get("recipe"))
    world = (metrics.get("device") or {}).get("count")
    if world is not None:
        settings.setdefault("world_size", world)
    return settings


def load_jobs(dirs: Sequence[str]) -> List[Job]:
    jobs = []
    for path in find_metrics(dirs):
        try:
            metrics = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            metrics = {"status": "failed", "error": f"unreadable metrics.json: {e}"}
        if not isinstance(metrics, dict):  # valid JSON, but not a run's record (a list, a number)
            metrics = {
                "status": "failed",
                "error": f"unreadable metrics.json: a JSON {type(metrics).__name__}, not a run's record",
            }
        jobs.append(Job(path.parent, metrics, _settings(metrics)))
    return jobs


def off_value(key: str) -> Any:
    """The "optimization off" value of a key: its schema default (None if the schema does not know it)."""
    return _schema_defaults().get(key)


_DEFAULTS_CACHE: Dict[str, Any] = {}


def _schema_defaults() -> Dict[str, Any]:
    if not _DEFAULTS_CACHE:
        from omegaconf import OmegaConf  # lazy: keeps omegaconf out of python -m trainer.report's start-up

        schema = OmegaConf.structured(TrainSchema)
        for key in SCHEMA_KEYS:
            try:
                value = OmegaConf.select(schema, key)
            except Exception:
                continue
            if not OmegaConf.is_config(value):
                _DEFAULTS_CACHE[key] = value
    return _DEFAULTS_CACHE


def varied_keys(jobs: List[Job]) -> List[str]:
    keys: List[str] = []
    for job in jobs:
        for k in job.settings:
            if k not in keys:
                keys.append(k)
    varied = []
    for k in keys:
        values = {json.dumps(job.value(k), sort_keys=True, default=str) for job in jobs}
        if len(values) > 1:
            varied.append(k)
    return varied


def fold_repeats(jobs: List[Job], varied: List[str]) -> List[Row]:
    """Finished jobs whose settings differ only in seed/repeat share a row; any other job is a row of its own."""
    rows: List[Row] = []
    by_key: Dict[str, Row] = {}
    several_sweeps = len({j.path.resolve().parent for j in jobs}) > 1
    repeat_keys = [k for k in varied if k in REPEAT_KEYS]
    for job in jobs:
        if not job.ok or not repeat_keys:
            rows.append(Row([job]))
            continue
        # same settings from two sweeps (two days, before/after a change) are a comparison, not repeats
        where = str(job.path.resolve().parent) if several_sweeps else ""
        key = json.dumps(
            [where, {k: job.value(k) for k in varied if k not in REPEAT_KEYS}],
            sort_keys=True,
            default=str,
        )
        which = [job.value(k) for k in repeat_keys]
        row = by_key.get(key)
        if row is not None and all([j.value(k) for k in repeat_keys] != which for j in row.jobs):
            row.jobs.append(job)
        else:
            by_key[key] = Row([job])
            rows.append(by_key[key])
    names = job_names(jobs)
    for row in rows:
        row.name = ",".join(names[id(j)] for j in row.jobs)
    return rows


def job_names(jobs: List[Job]) -> Dict[int, str]:
    """Unique, short names: the job number within one sweep; sweep dir + job when jobs come from several."""
    paths = [j.path.resolve() for j in jobs]
    parents = {p.parent for p in paths}
    if len(parents) == 1 and len(set(paths)) == len(paths):
        return {id(j): (p.name if p.name.isdigit() else str(j.path)) for j, p in zip(jobs, paths)}
    common = Path(os.path.commonpath([str(p) for p in paths])) if paths else Path(".")
    return {id(j): str(p.relative_to(common)) if p != common else p.name for j, p in zip(jobs, paths)}


def pick_baseline(rows: List[Row], varied: List[str]) -> Optional[Row]:
    """The first row with every varied key at its off value (keys without one are ignored), else the first ok row."""
    known = [k for k in varied if off_value(k) is not None and k not in REPEAT_KEYS]
    for row in rows:
        if row.ok and all(row.value(k) == off_value(k) for k in known):
            return row
    return next((r for r in rows if r.ok), None)
