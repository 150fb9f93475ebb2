"""What a run leaves for the user: the console, the output dirs, the trackers, the profile page, the doctor.

``console`` is what the terminal shows, ``run_dirs`` guards the output dirs (nothing finished is
overwritten), ``trackers`` and ``csv_logger`` hand the run to TensorBoard, MLflow, W&B and CSV,
``profile_page`` is the offline profile summary, ``doctor`` says where the time went.
(A sweep's A/B report, built from many runs' records, is ``trainer.report``.)

May use: ``switches``, ``models``, ``data``, ``launch``, ``measure``, ``config`` and the base modules;
never ``callbacks``, ``run``, ``report`` or the commands.
"""
