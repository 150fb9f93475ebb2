"""An opinionated Hydra + Lightning trainer whose optimizations are switches and whose output is an A/B table.

The package, by concern (each package's docstring says what belongs in it and what it may import;
pyproject.toml's ``[tool.importlinter]`` states the layers and ``make lint`` checks them):

- commands: ``cli`` (train.py), ``tune`` (python -m trainer.tune), ``sweep`` (Hydra's callback
  around a multirun), with ``command_line`` (the command line checked before Hydra composes);
  ``pack`` and ``torchrun`` are the documented paths of ``trainer.data.pack`` and
  ``trainer.launch.torchrun``; ``examples`` holds the ``_target_`` examples the README shows;
- ``run``: one training job (build the parts, fit, record); beside it ``report``, the A/B report a
  sweep ends with (python -m trainer.report), which a job never reads;
- ``callbacks``: the Lightning callbacks a job adds;
- ``output``: what a run leaves for the user (console, output dirs, trackers, profile page, doctor);
- ``switches``: where the optimization flags become Lightning's arguments and model changes;
- ``models`` and ``data``: what is trained, on what;
- ``launch``: how a job's processes start, stop and come back (ranks, torchrun, Slurm, checkpoints);
- ``measure``: metrics.json, time to target, FLOPs, CPU and memory, what the machine is;
- ``config``: the schema, its checks, composing a job's config;
- ``errors``, ``paths``, ``rank``: what every layer may use.

Heavy libraries (torch, Lightning) are imported lazily by the modules that need them, so that
``train.py --help``, tab completion, a refused command line and ``python -m trainer.report`` answer
in well under a second instead of paying torch's import (about 2-3 s on 2 cores). The modules that
run before a job starts import no torch at module level, and so import the heavy modules inside
their functions: ``cli``, ``command_line``, ``config``, ``output.run_dirs``, ``sweep`` (Hydra's
callback), ``output.console``, ``rank``, ``paths``, ``errors``, ``measure.metrics``, ``report`` and
``tune.app``. Elsewhere, imports inside functions mostly keep a module light for one of those
callers, or break a cycle.
"""

__version__ = "0.1.0"
