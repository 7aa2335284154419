"""Networks native to 32x32 images, registered in timm's model registry.

timm's ImageNet backbones downsample 4x in their stem, so on CIFAR they see 8x8 feature maps and
learn little per FLOP; at full resolution their stem makes them slow on a CPU. These two are built
for 32x32 inputs and are what a convergence-length run on a CPU can afford:

- ``cifar_resnet20``: the 20-layer CIFAR ResNet of He et al. (2016, section 4.2), widths 16/32/64,
  ~0.27 M parameters; ``cifar_resnet20_w2`` doubles every width.
- ``cifar_convnet``: the layout of Keller Jordan's airbench94 CIFAR-10 speed-run network (a 2x2
  stem conv, then three groups of conv -> max-pool -> BN -> GELU -> conv -> BN -> GELU at widths
  64/256/256, a max-pool head), with a learned stem instead of airbench's frozen whitening and
  no output scaling, so that plain SGD with the paper's hyper-parameters trains it;
  ``cifar_convnet_half`` halves every width (~0.5 M parameters).

Registering them makes them timm architectures like any other: ``--model cifar_resnet20``, and
`TimmWrapperForImageClassification` builds them by name. Importing `hf_selective_backprop`
registers them, which is all that a saved checkpoint needs to load again.
"""

from __future__ import annotations

import torch
from torch import nn

from ._optional import require

register_model = require("timm.models", "hf_selective_backprop.cifar_nets (networks registered in timm)").register_model


def _pretrained_cfg(**overrides) -> dict:
    return {
        "input_size": (3, 32, 32),
        "fixed_input_size": False,
        "interpolation": "bilinear",
        "crop_pct": 1.0,
        "first_conv": "stem.0",
        "classifier": "fc",
        **overrides,
    }


class _BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != channels:
            # He et al.'s option B (a 1x1 projection) where the shape changes.
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class _ClassifierHead(nn.Module):
    """timm's classifier interface (`num_classes`, `get_classifier`, `reset_classifier`, `forward_head`)."""

    num_classes: int
    num_features: int
    drop_rate: float
    fc: nn.Module

    def _init_head(self, num_features: int, num_classes: int, drop_rate: float) -> None:
        self.num_features = self.head_hidden_size = num_features
        self.num_classes = num_classes
        self.drop_rate = drop_rate
        self.head_drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(num_features, num_classes) if num_classes > 0 else nn.Identity()

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


class CifarResNet(_ClassifierHead, nn.Module):
    """He et al.'s CIFAR ResNet-(6n+2): a 3x3 stem, three stages of n blocks, global average pooling."""

    def __init__(
        self,
        depth: int = 20,
        width: int = 16,
        num_classes: int = 10,
        in_chans: int = 3,
        drop_rate: float = 0.0,
    ):
        nn.Module.__init__(self)
        if (depth - 2) % 6:
            raise ValueError(f"a CIFAR ResNet has 6n+2 layers, got depth={depth}")
        blocks = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(in_chans, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        stages, channels = [], width
        for i, stage_width in enumerate((width, 2 * width, 4 * width)):
            layers = []
            for b in range(blocks):
                layers.append(_BasicBlock(channels, stage_width, 2 if (i > 0 and b == 0) else 1))
                channels = stage_width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self._init_head(channels, num_classes, drop_rate)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3))


class _ConvGroup(nn.Sequential):
    def __init__(self, in_channels: int, channels: int):
        super().__init__(
            nn.Conv2d(in_channels, channels, 3, padding="same", bias=False),
            nn.MaxPool2d(2),
            nn.BatchNorm2d(channels),
            nn.GELU(),
            nn.Conv2d(channels, channels, 3, padding="same", bias=False),
            nn.BatchNorm2d(channels),
            nn.GELU(),
        )


class CifarConvNet(_ClassifierHead, nn.Module):
    """airbench94's layout: a 2x2 stem, three conv groups that each halve the resolution, a max-pool head."""

    def __init__(
        self,
        widths: tuple[int, int, int, int] = (24, 64, 256, 256),
        num_classes: int = 10,
        in_chans: int = 3,
        drop_rate: float = 0.0,
    ):
        nn.Module.__init__(self)
        stem, *groups = widths
        # A 2x2 convolution without padding: 32x32 in, 31x31 out, as in airbench.
        self.stem = nn.Sequential(nn.Conv2d(in_chans, stem, 2, bias=True), nn.GELU())
        channels, layers = stem, []
        for width in groups:
            layers.append(_ConvGroup(channels, width))
            channels = width
        self.groups = nn.Sequential(*layers)
        self._init_head(channels, num_classes, drop_rate)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.groups(self.stem(x))

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax((2, 3))


def _build(cls, name: str, pretrained: bool, kwargs: dict, **arch) -> nn.Module:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights: train it from scratch (--pretrained false)")
    # timm.create_model passes its weight-loading arguments to every model function.
    for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
        kwargs.pop(key, None)
    model = cls(**arch, **kwargs)
    model.pretrained_cfg = model.default_cfg = _pretrained_cfg(architecture=name)
    return model


@register_model
def cifar_resnet20(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-20 for 32x32 images (He et al., 2016), ~0.27 M parameters."""
    return _build(CifarResNet, "cifar_resnet20", pretrained, kwargs, depth=20, width=16)


@register_model
def cifar_resnet20_w2(pretrained: bool = False, **kwargs) -> CifarResNet:
    """ResNet-20 at twice the width (32/64/128), ~1.1 M parameters."""
    return _build(CifarResNet, "cifar_resnet20_w2", pretrained, kwargs, depth=20, width=32)


@register_model
def cifar_convnet(pretrained: bool = False, **kwargs) -> CifarConvNet:
    """airbench94's layout at full width (24 / 64 / 256 / 256), ~1.97 M parameters."""
    return _build(CifarConvNet, "cifar_convnet", pretrained, kwargs, widths=(24, 64, 256, 256))


@register_model
def cifar_convnet_half(pretrained: bool = False, **kwargs) -> CifarConvNet:
    """airbench94's layout at half width (24 / 32 / 128 / 128), ~0.5 M parameters."""
    return _build(CifarConvNet, "cifar_convnet_half", pretrained, kwargs, widths=(24, 32, 128, 128))
