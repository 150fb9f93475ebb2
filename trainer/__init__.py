"""An opinionated Hydra + Lightning trainer whose optimizations are switches and whose output is an A/B table.

The package, by concern (each package's docstring says what belongs in it and what it may import;
pyproject.toml's ``[tool.importlinter]`` states the layers and ``make lint`` checks them):

- entry points: ``cli`` (train.py); ``pack`` and ``torchrun``, the documented paths of
  ``trainer.data.pack`` and ``trainer.launch.torchrun``; ``examples``, the ``_target_`` examples the
  README shows;
- commands: ``tune`` (python -m trainer.tune), ``sweep`` (Hydra's callback around a multirun);
- ``run``: one training job (build the parts, fit, record); beside it ``report``, the A/B report a
  sweep ends with (python -m trainer.report), which a job never reads;
- ``callbacks``: the Lightning callbacks a job adds (and the profiler's offline page);
- ``switches``: where the optimization flags become Lightning's arguments and model changes;
- ``models`` and ``data``: what is trained, on what; beside them ``doctor`` (where the time went, from
  what was measured) and ``tracking`` (the experiment trackers);
- ``launch``: how a job's processes start, stop and come back (ranks, torchrun, Slurm, checkpoints,
  the output-dir guards);
- ``console`` (what the terminal shows) and ``command_line`` (the command line checked before Hydra
  composes);
- ``measure``: metrics.json, time to target, FLOPs, CPU and memory, what the machine is;
- ``config``: the schema, its checks, composing a job's config;
- ``errors``, ``paths``, ``rank``: what every layer may use.

Imports sit at the top of each module, except where an import inside a function keeps a process
light, and then the line says so. Heavy libraries (torch, Lightning) are imported lazily by the
modules that run before a job starts, so that ``train.py --help``, tab completion, a refused
command line and ``python -m trainer.report`` answer in well under a second instead of paying
torch's import (about 2-3 s on 2 cores): ``cli``, ``command_line``, ``config`` (and
``config.compose``), ``launch.run_dirs``, ``launch.processes`` and ``launch.preloaded`` (a job's
exit path and its launch), ``sweep`` (Hydra's callback), ``console``, ``rank``, ``paths``,
``errors``, ``measure.metrics``, ``report``, ``tune.app`` and ``tune.probe``; and by those of the
processes that never train: the tuner's own (``tune.search``, ``tune.candidates``,
``tune.output``; its probes train) and the built-in set's cutting processes (``data.builtin``,
``measure.hardware``). Their lazy imports say ``# lazy: ...`` and what they keep out of where. The
rest are optional dependencies (``# lazy: optional ([extra] extra)``, or a ``try`` that says what
to install) and private APIs inside the ``try`` that survives their absence.
"""

import getpass
import os
import re
import tempfile

__version__ = "0.1.0"


def _inductor_cache_per_cpu_capability() -> None:
    """A process whose CPU kernels are limited by ``ATEN_CPU_CAPABILITY`` (an AVX2 machine emulated on
    a newer one) gets an Inductor cache dir of that capability's own, unless the user named one.

    Inductor's on-disk cache does not key its CPU kernels on that setting: a kernel generated under
    one capability and loaded under another computed wrong values and corrupted the heap (a compiled
    uint8 normalization 1.8 off, then glibc's malloc assertion; NaN losses in the compile tests of the
    suite run under AVX2 emulation after a native run; torch 2.14 on an AVX512 CPU). Set here, at the
    package's import, before Lightning's import makes Inductor write its own default into the
    environment (the path is torch's default with the capability appended)."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if not capability:
        return
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}_{capability}"


_inductor_cache_per_cpu_capability()
