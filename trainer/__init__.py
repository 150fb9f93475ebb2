"""An opinionated Hydra + Lightning trainer whose optimizations are switches and whose output is an A/B table.

Heavy libraries (torch, Lightning) are imported lazily by the modules that need them, so that
``train.py --help``, tab completion and ``python -m trainer.report`` stay fast.
"""

__version__ = "0.1.0"
