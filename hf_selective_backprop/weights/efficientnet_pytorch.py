"""EfficientNet-PyTorch checkpoints (lukemelas/EfficientNet-PyTorch's key names) loaded into timm's EfficientNets.

EfficientNet-PyTorch numbers its blocks 0..N-1 (``_blocks.N``); timm groups the same blocks into stages
(``blocks.S.I``). The N-th block is the N-th in timm's stage order, and within a block the layers are renamed by
the block's kind: timm's ``DepthwiseSeparableConv`` (no expansion: the first block) or ``InvertedResidual``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

# EfficientNet-PyTorch's top-level layers and timm's names for them.
_STEM_AND_HEAD = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
                  "_fc": "classifier"}
# Within a block, by kind: with an expansion (InvertedResidual) and without one (DepthwiseSeparableConv).
_EXPANDED = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
             "_se_reduce": "se.conv_reduce", "_se_expand": "se.conv_expand", "_project_conv": "conv_pwl",
             "_bn2": "bn3"}
_DEPTHWISE_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_se_reduce": "se.conv_reduce",
                        "_se_expand": "se.conv_expand", "_project_conv": "conv_pw", "_bn2": "bn2"}
_BLOCK_KEY = re.compile(r"_blocks\.(\d+)\.(\w+)\.(\w+)")


def block_positions(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(stage, index) of each of a timm EfficientNet's blocks, in order: EfficientNet-PyTorch's block numbers."""
    return [(stage, index) for stage, blocks in enumerate(model.blocks) for index in range(len(blocks))]


def timm_state_dict(source: Mapping[str, torch.Tensor], positions: Sequence[tuple[int, int]]) -> dict:
    """``source`` (EfficientNet-PyTorch keys) under timm's key names; ``positions`` from `block_positions`.
    A key that fits neither naming is refused, naming it."""
    expanded = {int(match.group(1)) for key in source if (match := _BLOCK_KEY.fullmatch(key))
                and match.group(2) == "_expand_conv"}
    renamed = {}
    for key, tensor in source.items():
        match = _BLOCK_KEY.fullmatch(key)
        if match is not None:
            number, layer, parameter = int(match.group(1)), match.group(2), match.group(3)
            layers = _EXPANDED if number in expanded else _DEPTHWISE_SEPARABLE
            if number >= len(positions) or layer not in layers:
                raise ValueError(f"EfficientNet-PyTorch key {key!r} has no counterpart in a timm model of "
                                 f"{len(positions)} blocks")
            stage, index = positions[number]
            renamed[f"blocks.{stage}.{index}.{layers[layer]}.{parameter}"] = tensor
            continue
        layer, _, parameter = key.partition(".")
        if layer not in _STEM_AND_HEAD:
            raise ValueError(f"EfficientNet-PyTorch key {key!r} has no counterpart in a timm EfficientNet")
        renamed[f"{_STEM_AND_HEAD[layer]}.{parameter}"] = tensor
    return renamed


def load_efficientnet_pytorch_weights(model: torch.nn.Module, path: str) -> None:
    """Load the EfficientNet-PyTorch checkpoint at ``path`` into the timm EfficientNet ``model`` (built with the
    checkpoint's 1000 classes), every tensor shape for shape and every key of both sides used (strict)."""
    source = torch.load(path, map_location="cpu", weights_only=True)
    renamed = timm_state_dict(source, block_positions(model))
    expected = model.state_dict()
    wrong = [f"{key}: {tuple(tensor.shape)} for {tuple(expected[key].shape)}" for key, tensor in renamed.items()
             if key in expected and tensor.shape != expected[key].shape]
    if wrong:
        raise ValueError(f"{path}: tensors whose shape differs from {type(model).__name__}'s: {'; '.join(wrong)}")
    model.load_state_dict(renamed, strict=True)
