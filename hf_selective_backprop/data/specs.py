"""What is known about each built-in dataset: where it lives, its columns, its recipe."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset's source and CIFAR-style training recipe.

    ``mean``/``std`` are per source channel (None: measured on the training images);
    ``cutout`` is the side of the square zeroed by cutout (0: off), the per-dataset lengths
    of the Selective-Backprop paper; ``hflip`` is False where mirrored images change meaning
    (digits).
    """

    name: str
    hub_id: str | None = None
    config_name: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    cutout: int = 0
    hflip: bool = False
    image_size: int | None = None


KNOWN_DATASETS = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="cifar10",
            hub_id="uoft-cs/cifar10",
            image_column="img",
            label_column="label",
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2470, 0.2435, 0.2616),
            cutout=16,
            hflip=True,
        ),
        DatasetSpec(
            name="cifar100",
            hub_id="uoft-cs/cifar100",
            image_column="img",
            label_column="fine_label",
            mean=(0.5071, 0.4865, 0.4409),
            std=(0.2673, 0.2564, 0.2762),
            cutout=8,
            hflip=True,
        ),
        DatasetSpec(
            name="svhn",
            hub_id="ufldl-stanford/svhn",
            config_name="cropped_digits",
            image_column="image",
            label_column="label",
            mean=(0.4377, 0.4438, 0.4728),
            std=(0.1980, 0.2010, 0.1970),
            cutout=20,
        ),
        DatasetSpec(
            name="mnist",
            hub_id="ylecun/mnist",
            image_column="image",
            label_column="label",
            mean=(0.1307,),
            std=(0.3081,),
            cutout=8,
        ),
        # scikit-learn's bundled 8x8 digits: no download; upsampled so ImageNet stems fit.
        DatasetSpec(name="digits", image_column="image", label_column="label", cutout=8, image_size=32),
    )
}

# A dataset of unknown origin: columns are detected, statistics measured, no cutout/flip.
GENERIC = DatasetSpec(name="custom")


def _key(name: str) -> str:
    # "CIFAR-10", "cifar_10" and "cifar10" name the same dataset.
    return re.sub(r"[^a-z0-9]", "", name.lower())


def spec_for_name(name: str) -> DatasetSpec | None:
    """The spec whose short name or Hub id is ``name`` (case and punctuation ignored)."""
    key = _key(name)
    for spec in KNOWN_DATASETS.values():
        if key == _key(spec.name) or (spec.hub_id and key == _key(spec.hub_id)):
            return spec
    return None


def spec_for_folder(path: Path) -> DatasetSpec:
    """A local copy is recognised by its folder name (``.../cifar10``, ``.../ylecun-mnist``)."""
    key = _key(path.name)
    for spec in KNOWN_DATASETS.values():
        if spec.hub_id is None:
            continue
        if key in (_key(spec.name), _key(spec.hub_id), _key(spec.hub_id.split("/")[-1])):
            return spec
    return GENERIC
