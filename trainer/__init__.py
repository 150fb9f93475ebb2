"""An opinionated Hydra + Lightning trainer whose optimizations are switches and whose output is an A/B table.

Heavy libraries (torch, Lightning) are imported lazily by the modules that need them, so that
``train.py --help``, tab completion, a refused command line and ``python -m trainer.report`` answer
in well under a second instead of paying torch's import (about 2-3 s on 2 cores). The modules that
run before a job starts import no torch at module level, and so import the heavy modules inside
their functions: ``cli``, ``compose``, ``config``, ``outputs``, ``sweep`` (Hydra's callback),
``console``, ``rank``, ``paths``, ``errors``, ``metrics``, ``report`` and ``tune.app``. Elsewhere,
imports inside functions mostly keep a module light for one of those callers, or break a cycle.
"""

__version__ = "0.1.0"
