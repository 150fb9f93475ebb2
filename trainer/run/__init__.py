"""One training job, from a composed config to its metrics.json: ``run(cfg, out_dir)``.

``job`` is the job's order (build, fit, record, whatever fails), ``parts`` what a job is made of,
``build`` how each part is made, ``record`` what the job leaves behind. ``trainer.cli`` runs a job
through ``run`` once per (sweep) job; tests call it in-process with a config composed by ``hydra.compose``.

May use every part below it (``callbacks``, ``switches``, ``models``, ``data``, ``doctor``,
``tracking``, ``launch``, ``console``, ``measure``, ``config``, the base modules); never ``report`` (its sibling layer: a job
never reads a sweep's report), ``cli``, ``sweep`` or ``tune``.
"""

from trainer.run.job import run
from trainer.run.parts import flags_of

__all__ = ["flags_of", "run"]
