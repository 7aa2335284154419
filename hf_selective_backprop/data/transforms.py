"""CIFAR-style augmentation and normalization on whole uint8 batches.

Random crop with zero padding, horizontal flip and cutout are vectorised over the batch,
so augmenting costs a few tensor ops per batch instead of PIL work per image. Images may live
on an accelerator (a dataset held on the GPU): the random draws come from a CPU generator, whose
state a checkpoint saves whatever the device, and only the few offsets they give are copied over, from pinned
memory without waiting for the device.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch.utils.data import get_worker_info

from ..engine import transfer


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Pad each side with ``padding`` zeros and crop back to the original size at random offsets."""
    batch, channels, height, width = images.shape
    padded = torch.nn.functional.pad(images, (padding,) * 4).flatten(2)
    top = transfer.to_device(torch.randint(0, 2 * padding + 1, (batch, 1, 1), generator=generator), images.device)
    left = transfer.to_device(torch.randint(0, 2 * padding + 1, (batch, 1, 1), generator=generator), images.device)
    # One gather over flattened pixels: ~3x faster than 4-D advanced indexing.
    rows = (top + torch.arange(height, device=images.device)[:, None]) * (width + 2 * padding)
    pixels = (rows + left + torch.arange(width, device=images.device)).reshape(batch, 1, height * width)
    return padded.gather(2, pixels.expand(-1, channels, -1)).reshape(batch, channels, height, width)


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = transfer.to_device(torch.rand(images.shape[0], generator=generator) < 0.5, images.device)
    # A select, not boolean-mask indexing: that sizes its output by the data, a wait for a GPU every batch.
    return torch.where(flip.view(-1, *(1,) * (images.dim() - 1)), images.flip(-1), images)


def cutout(images: torch.Tensor, length: int, generator: torch.Generator) -> torch.Tensor:
    """Zero a ``length`` x ``length`` square per image, centred at a uniformly random pixel.

    As in DeVries & Taylor (2017): the square is clipped at the border, so it may be
    smaller there, and it is applied after normalization (zero = the dataset's mean).
    """
    batch, _, height, width = images.shape
    cy = transfer.to_device(torch.randint(0, height, (batch, 1), generator=generator), images.device)
    cx = transfer.to_device(torch.randint(0, width, (batch, 1), generator=generator), images.device)
    ys = torch.arange(height, device=images.device) - (cy - length // 2)
    xs = torch.arange(width, device=images.device) - (cx - length // 2)
    inside = ((ys >= 0) & (ys < length))[:, :, None] & ((xs >= 0) & (xs < length))[:, None, :]
    return images.masked_fill(inside[:, None], 0.0)


class BatchTransform:
    """uint8 (B, C, H, W) -> normalized float32, with training augmentation if ``augment``.

    Randomness comes from a private `torch.Generator` seeded with ``seed``, so a run is
    reproducible whatever else draws from the global RNG. In DataLoader workers each
    worker reseeds from its own torch-provided seed, so workers do not repeat each other.
    ``state_dict()`` / ``load_state_dict()`` save and restore the generator: a checkpoint holds
    them, so a resumed run draws the crops it would have drawn uninterrupted.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        augment: bool = False,
        crop_padding: int = 4,
        hflip: bool = False,
        cutout: int = 0,
        seed: int = 0,
    ):
        mean = torch.as_tensor(mean, dtype=torch.float32)
        std = torch.as_tensor(std, dtype=torch.float32)
        # (x / 255 - mean) / std as one multiply-add.
        self.scale = (1.0 / (255.0 * std))[:, None, None]
        self.shift = (-mean / std)[:, None, None]
        self.augment = augment
        self.crop_padding = crop_padding
        self.hflip = hflip
        self.cutout = cutout
        self.generator = torch.Generator().manual_seed(seed)
        self._worker_seed = None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if not self.augment:
            return self._normalize(images)
        generator = self._current_generator()
        if self.crop_padding:
            images = random_crop(images, self.crop_padding, generator)
        if self.hflip:
            images = random_hflip(images, generator)
        images = self._normalize(images)
        if self.cutout:
            images = cutout(images, self.cutout, generator)
        return images

    def _normalize(self, images: torch.Tensor) -> torch.Tensor:
        if self.scale.device != images.device:  # moved once, not copied every batch
            self.scale, self.shift = self.scale.to(images.device), self.shift.to(images.device)
        return images.float() * self.scale + self.shift

    def without_augmentation(self) -> BatchTransform:
        """The same normalization, no random augmentation (and no draw from this transform's generator)."""
        plain = copy.copy(self)
        plain.augment = False
        return plain

    def settings(self) -> dict:
        """The augmentation asked for, as the flags name it (a resume must not change it)."""
        if not self.augment:
            return {"augment": False}
        return {"augment": True, "hflip": self.hflip, "cutout": self.cutout, "crop_padding": self.crop_padding}

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    def _current_generator(self) -> torch.Generator:
        worker = get_worker_info()
        if worker is not None and worker.seed != self._worker_seed:
            # A worker holds a copy of this object: without a reseed every worker would
            # draw the same crops as the others.
            self._worker_seed = worker.seed
            self.generator = torch.Generator().manual_seed(worker.seed)
        return self.generator
