"""Tiny classifiers and synthetic data for trainer tests (no download, sub-second steps)."""

from __future__ import annotations

import torch
from datasets import Dataset
from torch import nn

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.data import BatchTransform, ImageTensorDataset

FEATURES, CLASSES = 8, 3


class TinyClassifier(nn.Module):
    """An MLP with the Trainer's conventions: (pixel_values, labels) -> {"loss", "logits"}."""

    def __init__(self, batch_norm: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        norm = nn.BatchNorm1d(16) if batch_norm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), norm, nn.ReLU(), nn.Linear(16, CLASSES))

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        outputs = {"logits": logits}
        if labels is not None:
            outputs["loss"] = nn.functional.cross_entropy(logits, labels)
        return outputs


def make_dataset(n: int = 256, seed: int = 0, with_index: bool = False) -> Dataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    columns = {"pixel_values": x.tolist(), "labels": y.tolist()}
    if with_index:
        columns["index"] = list(range(n))
    return Dataset.from_dict(columns).with_format("torch")


def make_images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (n, 1, 8, 8) images whose class is which of their first three column pairs is brightest."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (n, 1, 8, 8), generator=generator, dtype=torch.uint8)
    pairs = pixels.float()[:, 0, :, :6].reshape(n, 8, CLASSES, 2).mean((1, 3))
    return pixels, pairs.argmax(1)


def augmentation(seed: int) -> BatchTransform:
    """Random crop, flip and cutout, as the image workflow augments (with a generator of its own)."""
    return BatchTransform((0.5,), (0.25,), augment=True, crop_padding=2, hflip=True, cutout=3, seed=seed)


def make_image_dataset(n: int, seed: int = 0) -> ImageTensorDataset:
    """Augmented images with ids 0..n-1, as `scripts/train.py` serves its training split."""
    pixels, labels = make_images(n, seed)
    return ImageTensorDataset(pixels, labels, augmentation(seed), torch.arange(n))


class TinyConv(TinyClassifier):
    """A conv layer, dropout (it draws from the global RNG) and a linear head on (1, 8, 8) images;
    ``batch_norm`` adds running statistics that each process of a DDP run updates on its own."""

    def __init__(self, seed: int = 0, batch_norm: bool = False):
        nn.Module.__init__(self)
        torch.manual_seed(seed)
        norm = nn.BatchNorm2d(4) if batch_norm else nn.Identity()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), norm, nn.ReLU(), nn.Flatten(), nn.Dropout(0.25), nn.Linear(256, CLASSES)
        )


def make_config(output_dir: str, **overrides) -> SelectiveBackpropConfig:
    """The tests' settings; the strategy is Selective-Backprop itself unless ``overrides`` name another."""
    settings = dict(
        output_dir=output_dir,
        sb_strategy="sb",
        per_device_train_batch_size=8,
        num_train_epochs=2,
        learning_rate=0.05,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1000,
        seed=0,
    )
    settings.update(overrides)
    return SelectiveBackpropConfig(**settings)
