"""A tiny CNN: the default model, for tests and quick checks (it has convs and BatchNorm, so
channels_last, AMP and compile all have something to act on)."""

from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, batchnorm: bool = True):
        super().__init__()

        def block(cin, cout):
            norm = (
                nn.BatchNorm2d(cout) if batchnorm else nn.Identity()
            )  # no BatchNorm: ranks can match one process exactly
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=not batchnorm), norm, nn.ReLU(inplace=True))

        self.features = nn.Sequential(
            block(3, width), nn.MaxPool2d(2), block(width, 2 * width), nn.MaxPool2d(2), block(2 * width, 4 * width)
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))
