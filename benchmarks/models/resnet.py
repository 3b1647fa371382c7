"""ResNet-18 (He et al. 2015), written out: there is no CPU build of torchvision here.

Standard layout: conv7x7/2 -> BN -> ReLU -> maxpool3x3/2 -> 4 stages of 2 BasicBlocks
(64, 128, 256, 512 channels; stages 2-4 start with stride 2 and a 1x1/2 projection shortcut)
-> global average pool -> fc. 11,689,512 parameters for 1000 classes (torchvision's count).
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18; ``widths`` and ``num_classes`` are parameters so quick mode can build a narrow one."""

    def __init__(self, num_classes: int = 1000, widths: tuple[int, int, int, int] = (64, 128, 256, 512),
                 blocks: tuple[int, int, int, int] = (2, 2, 2, 2)) -> None:
        super().__init__()
        w0 = widths[0]
        self.conv1 = nn.Conv2d(3, w0, 7, stride=2, padding=3, bias=False)   # (B,3,H,W) -> (B,w0,H/2,W/2)
        self.bn1 = nn.BatchNorm2d(w0)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)                  # -> H/4
        stages = []
        c_in = w0
        for i, (w, n) in enumerate(zip(widths, blocks, strict=True)):
            layers = [BasicBlock(c_in, w, stride=1 if i == 0 else 2)] + [BasicBlock(w, w) for _ in range(n - 1)]
            stages.append(nn.Sequential(*layers))
            c_in = w
        self.layer1, self.layer2, self.layer3, self.layer4 = stages           # H/4, H/8, H/16, H/32
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)                                 # (B, 512)
        return self.fc(x)                                                     # (B, num_classes)
