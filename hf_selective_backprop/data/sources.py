"""Find a dataset by name, Hub id or folder and open it as a `datasets.DatasetDict`.

Nothing is decoded here: images stay encoded until the chosen rows are selected.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import datasets
import numpy as np

from .arguments import DataArguments
from .specs import GENERIC, KNOWN_DATASETS, DatasetSpec, describe_recipe, spec_for_card, spec_for_folder, spec_for_name

logger = logging.getLogger(__name__)


def open_source(args: DataArguments) -> tuple[datasets.DatasetDict, DatasetSpec, str]:
    """The dataset's splits, its spec and a printable description of where it came from. One log line says which
    recipe (statistics, flips, cutout) the spec gives and what chose it; a WARNING where the user named none."""
    spec = spec_for_name(args.dataset)
    if args.data_dir is not None:
        folder = _existing_folder(args.data_dir, "--data_dir")
        if spec is not None:
            _say_recipe(args, spec, f"as --dataset {args.dataset!r} names it", str(folder), chosen=True, local=True)
        else:
            spec = _spec_of_folder(args, folder, str(folder))
        return _load(str(folder), args.dataset_config, args.cache_dir), spec, str(folder)
    if spec is not None and spec.name == "digits":
        _say_recipe(args, spec, f"as --dataset {args.dataset!r} names it", "sklearn.datasets.load_digits",
                    chosen=True)
        return sklearn_digits(), spec, "sklearn.datasets.load_digits"
    local = Path(args.dataset).expanduser()
    if local.exists():
        folder = _existing_folder(args.dataset, "--dataset")
        spec = _spec_of_folder(args, folder, str(folder))
        return _load(str(folder), args.dataset_config, args.cache_dir), spec, str(folder)
    if spec is not None:
        config = args.dataset_config or spec.config_name
        _say_recipe(args, spec, f"as --dataset {args.dataset!r} names it", spec.hub_id, chosen=True)
        return _load(spec.hub_id, config, args.cache_dir), spec, spec.hub_id
    if args.dataset.startswith((".", "/", "~")) or args.dataset.count("/") != 1:
        raise ValueError(
            f"--dataset {args.dataset!r} is neither a known dataset ({', '.join(KNOWN_DATASETS)}), "
            "a Hub id (owner/name) nor an existing local folder"
        )
    # Any other owner/name goes to the Hub (needs the network); `datasets` explains failures.
    spec = spec_for_folder(Path(args.dataset))
    if spec is GENERIC:
        _say_recipe(args, spec, "as its Hub id names no known dataset", args.dataset, chosen=False)
    else:
        _say_recipe(args, spec, "as its Hub id's name says", args.dataset, chosen=True)
    return _load(args.dataset, args.dataset_config, args.cache_dir), spec, args.dataset


def _spec_of_folder(args: DataArguments, folder: Path, source: str) -> DatasetSpec:
    """A local folder's spec: by its name, else by what its dataset card (README.md) names, else generic."""
    spec = spec_for_folder(folder)
    if spec is not GENERIC:
        _say_recipe(args, spec, "as the folder's name says", source, chosen=True, local=True)
        return spec
    carded, why = spec_for_card(folder)
    _say_recipe(args, carded or GENERIC, why, source, chosen=False, local=True)
    return carded or GENERIC


def _say_recipe(args: DataArguments, spec: DatasetSpec, why: str, source: str, chosen: bool,
                local: bool = False) -> None:
    """Log the recipe a run trains with and what chose it: INFO where the user named it (a known name, a folder
    named after one), WARNING where it was inferred from a dataset card or nothing named one (the generic recipe),
    unless --hflip and --cutout both set the augmentation themselves."""
    others = ", ".join(name for name, known in KNOWN_DATASETS.items() if known.hub_id)
    how = "--hflip and --cutout set its augmentation"
    if local:
        how = (f"--dataset NAME --data_dir {args.data_dir or args.dataset} trains it with a known dataset's recipe "
               f"(NAME: {others}); {how}")
    level = logging.INFO if chosen or (args.hflip is not None and args.cutout is not None) else logging.WARNING
    logger.log(level, "%s: training with %s, %s. %s", source, describe_recipe(spec), why, how)


def _existing_folder(path: str, flag: str) -> Path:
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ValueError(f"{flag} {path!r}: no such folder (expected a dataset folder in the Hub layout)")
    return folder


def load_splits(path: str, config: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    """`datasets.load_dataset`, saying which split is empty where it only says 'Instruction "train" corresponds to
    no data!' (a data file with zero rows)."""
    try:
        return datasets.load_dataset(path, config, cache_dir=cache_dir)
    except ValueError as error:
        empty = re.fullmatch(r'Instruction "(.+)" corresponds to no data!', str(error))
        if empty is None:
            raise
        raise ValueError(
            f"{path!r}: its {empty.group(1)!r} split is empty (0 rows); its data files hold no examples"
        ) from error


def _load(path: str, config: str | None, cache_dir: str | None) -> datasets.DatasetDict:
    loaded = load_splits(path, config, cache_dir)
    if not isinstance(loaded, datasets.DatasetDict):
        raise ValueError(f"{path!r} did not load as a dataset with named splits")
    return loaded


def sklearn_digits(test_size: int = 360, seed: int = 0) -> datasets.DatasetDict:
    """scikit-learn's 1,797 bundled 8x8 digits as train/test splits (stratified, fixed seed).

    Real handwritten digits that ship inside scikit-learn: a dataset that needs no download,
    for smoke runs and tests. Pixel values 0..16 are scaled to 0..255.
    """
    from .._optional import require

    require("sklearn", "the digits dataset (scikit-learn's bundled digits)")
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    ids = np.arange(len(images))
    train_ids, test_ids = train_test_split(ids, test_size=test_size, stratify=digits.target, random_state=seed)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(d) for d in range(10)])}
    )

    def split(rows: np.ndarray) -> datasets.Dataset:
        rows = np.sort(rows)  # keep scikit-learn's order within each split
        return datasets.Dataset.from_dict(
            {"image": list(images[rows]), "label": digits.target[rows].tolist()}, features=features
        )

    return datasets.DatasetDict({"train": split(train_ids), "test": split(test_ids)})
