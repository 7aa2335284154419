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
    (digits). ``aliases`` are other names a dataset card gives the dataset (its ``pretty_name``).
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
    aliases: tuple[str, ...] = ()


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
            aliases=("Street View House Numbers",),
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


def _names(spec: DatasetSpec) -> set[str]:
    """The keys that name a spec downloadable from the Hub: its short name, Hub id, the id's name, its aliases."""
    names = {spec.name, spec.hub_id, spec.hub_id.split("/")[-1], *spec.aliases} if spec.hub_id else set()
    return {_key(name) for name in names}


def _known_by(name: str) -> DatasetSpec | None:
    """The Hub-hosted known dataset ``name`` names; scikit-learn's digits (no Hub id) is never taken from a
    folder, since its name is too common to mean that dataset."""
    key = _key(name)
    return next((spec for spec in KNOWN_DATASETS.values() if key and key in _names(spec)), None)


def spec_for_folder(path: Path) -> DatasetSpec:
    """A local copy is recognised by its folder name (``.../cifar10``, ``.../ylecun-mnist``)."""
    return _known_by(path.name) or GENERIC


#: The dataset card's front-matter keys that name the dataset it describes (the Hub's cards set them).
CARD_NAME_KEYS = ("pretty_name", "paperswithcode_id")


def card_names(folder: Path) -> list[tuple[str, str]]:
    """What the folder's dataset card (``README.md``) calls the dataset, as (where, name) pairs: the front
    matter's ``pretty_name`` and ``paperswithcode_id``, the ``config_name`` (or ``dataset_name``) of each
    ``dataset_info`` and ``configs`` entry, and the card's title (its first ``# `` heading, without a leading
    "Dataset Card for" or a parenthesised remark, and the title's first word). Nothing where there is no card or
    it cannot be read: a card only ever adds a hint."""
    readme = folder / "README.md"
    if not readme.is_file():
        return []
    import yaml
    from huggingface_hub import DatasetCard

    try:
        card = DatasetCard.load(readme)
    except (OSError, ValueError, yaml.YAMLError):
        return []
    data = card.data.to_dict()
    found = [(f"its {key}", data[key]) for key in CARD_NAME_KEYS if isinstance(data.get(key), str)]
    for section in ("dataset_info", "configs"):
        entries = data.get(section)
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, dict):
                found += [(f"its {section} {key}", entry[key]) for key in ("config_name", "dataset_name")
                          if isinstance(entry.get(key), str)]
    title = next((line[2:].strip() for line in card.text.splitlines() if line.startswith("# ")), None)
    if title:
        title = re.sub(r"^dataset card for\s+", "", title, flags=re.IGNORECASE).split("(")[0].strip(" :,.-")
        found.append(("its title", title))
        if title.split() and title.split()[0] != title:
            found.append(("its title", title.split()[0].strip(" :,.")))
    return found


def spec_for_card(folder: Path) -> tuple[DatasetSpec | None, str]:
    """The known dataset the folder's dataset card names, and a phrase saying where the card names it; (None, why
    not) where it names none, or more than one."""
    named: dict[str, list[str]] = {}
    for where, name in card_names(folder):
        spec = _known_by(name)
        if spec is not None:
            named.setdefault(spec.name, []).append(f"{where} {name!r}")
    if len(named) == 1:
        (name, places), = named.items()
        return KNOWN_DATASETS[name], f"as its README.md names it ({', '.join(places)})"
    if named:
        listed = "; ".join(f"{name} ({', '.join(places)})" for name, places in named.items())
        return None, f"as its README.md names more than one known dataset, none is taken: {listed}"
    return None, "as neither the folder's name nor its README.md names a known dataset"


def describe_recipe(spec: DatasetSpec) -> str:
    """'the cifar10 recipe (its published mean and std, random flips, cutout 16)': what a spec trains with."""
    parts = ["its published mean and std" if spec.mean is not None else "mean and std measured on the training images",
             "random flips" if spec.hflip else "no flips", f"cutout {spec.cutout}" if spec.cutout else "no cutout"]
    if spec.image_size:
        parts.append(f"images resized to {spec.image_size} px")
    name = "generic" if spec is GENERIC else spec.name
    return f"the {name} recipe ({', '.join(parts)})"
