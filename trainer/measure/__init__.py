"""What a run measured and what the machine is: metrics.json, time to target, FLOPs, CPU and memory use.

``metrics`` writes and reads metrics.json (the record every report is built from),
``time_to_target`` when a run first reached its target, ``flops`` FLOPs per sample and the device's
peak, ``sysstats`` and ``memory`` the CPU and memory a run used, ``hardware`` what this machine is.

May use: ``config`` and the base modules (``errors``, ``paths``, ``rank``) only; measuring never
depends on how a run was launched, trained or reported.
"""
