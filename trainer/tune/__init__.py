"""``python -m trainer.tune``: the fastest accuracy-safe configuration for this model on this machine.

The tuner probes real training runs (``probe``), guided by the bottleneck doctor through the
switchboard's candidates (``candidates``), keeps a flag only on measured evidence and checks the
winner's accuracy (``search``), and writes ``best.yaml`` and its report (``output``). ``app`` is the
Hydra entry point.

May use ``command_line`` (it checks its command line as train.py does) and every package below it;
never ``cli`` (train.py's entry point) or ``sweep``. Its probes run ``train.py`` in child processes.
"""
