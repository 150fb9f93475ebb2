"""The loader objects: each way a batch is made (torch workers, nvJPEG, device-resident synthetic
images, DALI) as an object of its own behind one interface (``base.Loaders``), chosen once per run.

``loaders_for`` picks the one the data keys ask for; the datamodule then only calls it: the train
and val loaders, the hand-over to the device, ``state_dict``/``load_state_dict`` for an exact
resume, and ``describe`` for metrics.json.
"""

from __future__ import annotations

from trainer.data.dali import samples_of
from trainer.data.loaders.base import Loaders, LoaderSetup
from trainer.data.loaders.dali import DaliLoaders
from trainer.data.loaders.device_resident import DeviceResidentLoaders
from trainer.data.loaders.nvjpeg import NvjpegLoaders
from trainer.data.loaders.torch_workers import TorchLoaders

__all__ = ["LoaderSetup", "Loaders", "loaders_for"]


def loaders_for(setup: LoaderSetup, train_set, val_set) -> Loaders:
    """The loader object for ``setup``, over data sets already built."""
    c = setup.cfg
    if c.get("loader", "torch") == "dali":
        return DaliLoaders(setup, samples_of(train_set), samples_of(val_set) if val_set is not None else [])
    if c.name == "synthetic" and c.get("device_resident"):
        return DeviceResidentLoaders(setup)
    if setup.decoder == "nvjpeg" and c.name in ("imagefolder", "builtin", "imagenette"):  # it decodes image files
        return NvjpegLoaders(setup)

    return TorchLoaders(setup)
