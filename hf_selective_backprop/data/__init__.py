"""Vision data for Selective-Backprop runs: decode once, augment per batch, stable ids.

The names below load on first use, so that importing a light submodule (``data.specs``, which the
model card reads) does not import torchvision, which image decoding needs (the ``vision`` extra).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "DataArguments": ".arguments",
    "ImageClassificationData": ".datasets",
    "ImageTensorDataset": ".datasets",
    "load_image_data": ".datasets",
    "flip_labels": ".noise",
    "KNOWN_DATASETS": ".specs",
    "DatasetSpec": ".specs",
    "BatchTransform": ".transforms",
}

__all__ = [
    "KNOWN_DATASETS",
    "BatchTransform",
    "DataArguments",
    "DatasetSpec",
    "ImageClassificationData",
    "ImageTensorDataset",
    "flip_labels",
    "load_image_data",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
