"""The switchboard: where the optimization flags become Lightning's arguments and changes to the model.

``switchboard`` resolves precision, strategy and devices for this machine (and refuses what cannot
run here), ``model_transforms`` applies the model-side flags in one order (channels_last,
activation checkpointing, compile), ``batch_finder`` settles ``data.batch_size=auto``.

May use: ``models``, ``data``, ``measure``, ``launch``, ``config`` and the base modules (``errors``,
``paths``, ``rank``); never ``run``, ``cli``, ``sweep``, ``callbacks``, ``output`` or ``report``.
"""
