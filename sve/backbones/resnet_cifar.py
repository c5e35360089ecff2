"""CIFAR ResNets (He et al., 2016, Sec. 4.2) matching the public ``pytorch_resnet_cifar10`` checkpoints.

ResNet-(6n+2): a 3x3 stem conv with 16 channels, three stages of n basic blocks with 16, 32 and 64
channels (stride 2 at the start of stages 2 and 3), global average pooling and a linear layer. Shortcuts
are "option A": identity, or where the shape changes, stride-2 subsampling plus zero channels (no
parameters). Module names (``conv1, bn1, layer1.0.conv1, ..., linear``) are those of the checkpoints,
whose keys carry a ``module.`` prefix from DataParallel.

The backbone keeps BatchNorm in eval mode (``freeze_bn``): the checkpoint's running statistics are used
in training too, so the M members stacked in one batch never share batch statistics, and a frozen
backbone (SVE) stays exactly frozen.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sve.backbones.base import Backbone
from sve.errors import InputError
from sve.paths import missing_file

CIFAR_MEAN, CIFAR_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet statistics, as trained


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.pad = (planes - in_planes) // 2 if stride != 1 or in_planes != planes else None

    def shortcut(self, x: Tensor) -> Tensor:
        if self.pad is None:
            return x
        # Option A: subsample by 2 and pad the new channels with zeros on both sides.
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetCIFAR(nn.Module):
    def __init__(self, depth: int = 20, num_classes: int = 10):
        super().__init__()
        if (depth - 2) % 6:
            raise InputError(f"CIFAR ResNet depth must be 6n+2 (20, 32, 44, 56, ...), got {depth}")
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        stages, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(64, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """(N, 3, H, W) -> (N, 64) pooled features."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return out.mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(self.features(x))


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Loads a ``pytorch_resnet_cifar10`` file: ``{'state_dict': {'module.conv1.weight': ...}}``."""
    state = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=False)
    state = state.get("state_dict", state)
    state = {k.removeprefix("module."): v for k, v in state.items()}
    model.load_state_dict(state, strict=True)


class ResNetCIFARBackbone(Backbone):
    """Args:
    depth: 20, 32, 44 or 56.
    target_modules: name patterns of the convolutions to adapt (Conv2d layers).
    checkpoint_path: a ``resnet<depth>-*.th`` file; None with ``pretrained: false`` keeps random weights.
    pretrained: load ``checkpoint_path``.
    freeze_bn: keep BatchNorm layers in eval mode (see module docstring).
    """

    modality = "image"
    image_size = 32
    crop_pct = 1.0  # test images at their native 32 px (no resize, no crop)
    train_crop = "pad"  # the CIFAR recipe: pad 4 + random crop + flip
    mean, std = CIFAR_MEAN, CIFAR_STD
    head_task = "cifar10"  # the dataset the checkpoints' classifier was trained on (sve.data name)

    def __init__(
        self,
        depth: int,
        target_modules: list[str],
        checkpoint_path: str | None = None,
        pretrained: bool = True,
        freeze_bn: bool = True,
    ):
        model = ResNetCIFAR(depth)
        if pretrained:
            if not checkpoint_path or not Path(checkpoint_path).expanduser().is_file():
                raise InputError(
                    f"backbone resnet{depth}_cifar: "
                    f"{missing_file('backbone.checkpoint_path', checkpoint_path, f'a resnet{depth}-*.th file')} "
                    "(pytorch_resnet_cifar10's: 'state_dict' keys 'module.conv1.weight', ..., 'module.linear.bias'; "
                    "the shared folder has them in models/resnet_cifar10), or backbone.pretrained=false"
                )
            load_checkpoint(model, checkpoint_path)
        super().__init__(model, target_modules)
        self.pretrained = pretrained
        self.depth = depth
        self.freeze_bn = freeze_bn
        self.feature_dim = model.linear.in_features

    def train(self, mode: bool = True):
        super().train(mode)
        if self.freeze_bn:
            for m in self.model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self

    @torch.no_grad()
    def initial_head(self, task: str | None, num_classes: int) -> tuple[Tensor, Tensor] | None:
        """The checkpoint's classifier, only for the task it was trained on (CIFAR-10), never for another
        task that happens to have 10 classes (Fashion-MNIST would start from airplane/car/... weights)."""
        if not self.pretrained or task != self.head_task or num_classes != self.model.linear.out_features:
            return None
        return self.model.linear.weight.detach().clone(), self.model.linear.bias.detach().clone()

    def probe_batch(self) -> dict:
        return {"pixel_values": torch.zeros(1, 3, self.image_size, self.image_size)}

    def forward(self, batch: dict) -> Tensor:
        return self.model.features(batch["pixel_values"])
