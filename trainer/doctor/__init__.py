"""The bottleneck doctor: from what a run measured, where the time went and which flags to try.

``diagnose`` reads the verdict off the measurements (the decision tree: its module's docstring, the
rules in the order ``RULES`` tries them); ``advice`` holds the flags to try for each kind of
bottleneck and the hardware's notes;
``feeding`` says, for an input-bound GPU run, which loader would feed it from measured rates; ``facts``
holds what the doctor is told besides the measurements (``Facts``: whether DALI is installed, whether
the data is read from an object store): it reads no loader code itself.

May use: ``measure`` and the base modules; never the data, the models or the trackers (its siblings
in pyproject.toml's layers), nor anything above them.
"""

from trainer.doctor.diagnose import (
    compute_suggestions,
    decode_suggestions,
    diagnose,
    hardware_notes,
    heavy_augmentation,
)
from trainer.doctor.facts import Facts, dali_takes
from trainer.doctor.feeding import feeding

__all__ = [
    "Facts",
    "compute_suggestions",
    "dali_takes",
    "decode_suggestions",
    "diagnose",
    "feeding",
    "hardware_notes",
    "heavy_augmentation",
]
