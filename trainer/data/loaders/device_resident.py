"""``data.device_resident`` (``data=synthetic``'s default): the synthetic pool lives on the training
device and a batch is one gather there (``synthetic.DeviceResidentImages``): no workers, no pinning,
no copy. The order is the torch loader's, so a resume continues exactly as there."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from trainer.data.loaders.base import Loaders
from trainer.data.synthetic import DeviceResidentImages, batch_as_is


class DeviceResidentLoaders(Loaders):
    name = "device-resident"

    def _device(self):
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def _data_loader(self, dataset, sampler, train: bool) -> DataLoader:
        return DataLoader(
            DeviceResidentImages(dataset, self._device()),
            batch_size=self.setup.cfg.batch_size,
            sampler=sampler,
            collate_fn=batch_as_is,
            drop_last=train and self.setup.cfg.drop_last,
            num_workers=0,
        )

    def train(self, dataset) -> DataLoader:
        return self._data_loader(dataset, self.training_order(len(dataset)), train=True)

    def val(self, dataset) -> DataLoader:
        return self._data_loader(dataset, None, train=False)
