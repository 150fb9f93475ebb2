"""How a job's processes start, stop and come back: ranks, torchrun, Slurm, stop signals and checkpoints.

``processes`` starts a job's ranks (torchrun, an allocator preload), ``torchrun`` is the launcher's
torchrun, ``slurm`` requeues and resumes, ``stopping`` and ``stop_agreement`` turn a signal into a
checkpoint at a step every rank agrees on, ``checkpoint_files`` writes and reads checkpoints safely,
``preloaded`` forks short runs from a server that has already imported torch, ``run_dirs`` guards the
output dirs (nothing finished is overwritten).

May use: ``console``, ``measure``, ``config`` and the base modules (``errors``, ``paths``, ``rank``); nothing
that trains or reports (``run``, ``cli``, ``sweep``, ``callbacks``, ``report``, ``models``, ``data``).
"""
