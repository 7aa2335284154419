"""Vision data for Selective-Backprop runs: decode once, augment per batch, stable ids."""

from .arguments import DataArguments
from .datasets import ImageClassificationData, ImageTensorDataset, load_image_data
from .noise import flip_labels
from .specs import KNOWN_DATASETS, DatasetSpec
from .transforms import BatchTransform

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
