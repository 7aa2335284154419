"""Image-classification data held in memory as uint8 tensors, served as dict rows."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import datasets
import torch

from ..engine import transfer
from .arguments import DataArguments
from .decode import decode_images
from .labels import class_ids, kept_label_names, label_names_of
from .noise import flip_labels, holdout_positions
from .sources import open_source
from .specs import DatasetSpec
from .transforms import BatchTransform

logger = logging.getLogger(__name__)


class ImageTensorDataset(torch.utils.data.Dataset):
    """Rows ``{"pixel_values": float (C, H, W), "labels": int64, "index": int64}``.

    ``index`` (train split only) is the example's stable id: its position in the original
    split, whatever the subset or shuffle. Augmentation runs once per batch in
    ``__getitems__``, which DataLoader calls with a whole batch of positions. It lives in
    the dataset rather than in a collator because the Trainer passes evaluation batches
    through the same collator as training ones; here the eval dataset simply has no
    augmentation. Transformers' `default_data_collator` stacks the rows.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: BatchTransform,
        index: torch.Tensor | None = None,
        index_column: str = "index",
    ):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"images must be uint8 (N, C, H, W), got {images.dtype} {tuple(images.shape)}")
        if len(labels) != len(images) or (index is not None and len(index) != len(images)):
            raise ValueError("images, labels and index must have the same length")
        self.images = images
        self.labels = labels
        self.transform = transform
        self.index = index
        #: The key of the ids in each row: the trainer's --sb_index_column.
        self.index_column = index_column
        #: Ids (``index`` values) whose label was flipped by label noise.
        self.noisy_indices = torch.empty(0, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.images)

    def __getitems__(self, positions: list[int]) -> list[dict]:
        positions = torch.as_tensor(positions, dtype=torch.int64)
        held = transfer.to_device(positions, self.images.device)  # gathering with host positions would wait for a GPU
        columns = {"pixel_values": self.transform(self.images[held]), "labels": self.labels[held]}
        if self.index is not None:
            columns[self.index_column] = self.index[positions]
        # unbind: one call for all row views instead of an indexing op per row and column.
        return [
            dict(zip(columns, row, strict=True)) for row in zip(*(c.unbind() for c in columns.values()), strict=True)
        ]

    def __getitem__(self, position: int) -> dict:
        return self.__getitems__([position])[0]

    def without_augmentation(self) -> ImageTensorDataset:
        """The same rows (tensors shared, not copied) as evaluation sees them: normalized, not augmented."""
        view = ImageTensorDataset(
            self.images, self.labels, self.transform.without_augmentation(), self.index, self.index_column
        )
        view.noisy_indices = self.noisy_indices
        return view

    def to(self, device: torch.device | str) -> ImageTensorDataset:
        """The same rows with images and labels held on ``device`` (a GPU): batches are gathered and augmented
        there, so a small dataset costs the host no per-batch copies. The ids stay on the host, where selection
        and the record key examples by them. Train with ``dataloader_pin_memory=False`` (only host memory pins)
        and no loader workers."""
        moved = ImageTensorDataset(
            self.images.to(device), self.labels.to(device), self.transform, self.index, self.index_column
        )
        moved.noisy_indices = self.noisy_indices
        return moved

    def example_ids(self) -> torch.Tensor | None:
        """The id of every row, without loading (and augmenting) any: what selection keys examples by."""
        return self.index

    def augmentation(self) -> dict:
        """What augments the rows (recorded in checkpoints: a resume with other augmentation is refused)."""
        return self.transform.settings()

    # A checkpoint of SelectiveBackpropTrainer saves and restores this state (the augmentation generator).
    def state_dict(self) -> dict:
        return {"transform": self.transform.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.transform.load_state_dict(state["transform"])

    def fingerprint(self, images_hashed: int = 64) -> str:
        """A hash of the data as stored (not augmented): every label and id, and evenly spaced images.

        A checkpoint records it, so resuming on other data is refused instead of mixing two datasets.
        """
        digest = hashlib.sha256(repr(tuple(self.images.shape)).encode())
        positions = torch.linspace(0, len(self.images) - 1, min(len(self.images), images_hashed)).long()
        for tensor in (self.labels, self.index, self.images[positions]):
            if tensor is not None:
                digest.update(tensor.contiguous().cpu().numpy().tobytes())
        return digest.hexdigest()


@dataclass
class ImageClassificationData:
    """Everything a training script needs from the data side."""

    train: ImageTensorDataset
    eval: ImageTensorDataset | None
    label_names: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    image_size: tuple[int, int]
    num_channels: int
    spec: DatasetSpec
    #: Where the data came from (Hub id, folder or scikit-learn), for logs and model cards.
    source: str
    #: Ids of the rows --holdout_fraction set aside (None without a holdout).
    holdout_ids: torch.Tensor | None = None

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    @property
    def dataset_id(self) -> str:
        """The Hub id of the dataset if it is a known one, else its source."""
        return self.spec.hub_id or self.source


def load_image_data(args: DataArguments, seed: int = 0, index_column: str = "index",
                    statistics: tuple[Sequence[float], Sequence[float]] | None = None) -> ImageClassificationData:
    """Open, check, subset, decode (once), add ids and label noise; ``seed`` seeds augmentation.

    ``statistics`` (mean, std) normalizes as pretrained weights expect (`models.pretrained_statistics`); by
    default the dataset's known statistics, else those measured on the training images.

    The training rows carry their ids under ``index_column`` (the trainer's --sb_index_column).

    Splits, columns and labels are checked before any image is decoded, so a wrong flag or a
    stray label fails in seconds, not after decoding a whole split.
    """
    splits, spec, source = open_source(args)
    train_split = _split(splits, args.train_split, "--train_split", source)
    image_column, label_column = _columns(train_split, spec, args)
    eval_split = None
    if args.eval_split is not None:
        eval_split = _split(splits, args.eval_split, "--eval_split", source)
        _check_columns(eval_split, (image_column, label_column), args.eval_split)
    label_names, declared_by = label_names_of(train_split, eval_split, args, label_column)

    train_rows = _first(train_split, args.max_train_samples)
    train_labels = class_ids(train_rows, label_column, label_names, declared_by, f"--train_split {args.train_split!r}")
    # First N rows of the split, so ids are 0..N-1 and equal positions in the original split.
    ids = torch.arange(len(train_rows))
    if eval_split is not None:
        eval_rows = _first(eval_split, args.max_eval_samples)
        eval_labels = class_ids(eval_rows, label_column, label_names, declared_by, f"--eval_split {args.eval_split!r}")
    kept_classes = args.class_ids()
    if kept_classes is not None:
        # Before decoding, so the images of dropped classes are never decoded.
        label_names = kept_label_names(label_names, kept_classes)
        ids, train_rows, train_labels = _keep_classes(train_rows, train_labels, kept_classes, "--train_split")
        if eval_split is not None:
            _, eval_rows, eval_labels = _keep_classes(eval_rows, eval_labels, kept_classes, "--eval_split")

    size = (args.image_size,) * 2 if args.image_size else ((spec.image_size,) * 2 if spec.image_size else None)
    train_images = _decode(train_rows, image_column, args.num_channels, size, f"{source} [{args.train_split}]")
    size = tuple(train_images.shape[2:])

    noisy = torch.empty(0, dtype=torch.int64)
    if args.label_noise:
        train_labels, noisy = flip_labels(train_labels, args.label_noise, len(label_names), args.label_noise_seed)
        logger.info("label noise: flipped %d of %d training labels", len(noisy), len(train_labels))

    if statistics is not None:
        mean, std = (tuple(float(v) for v in values) for values in statistics)
        if len(mean) != args.num_channels or len(std) != args.num_channels:
            raise ValueError(f"the pretrained weights' normalization has {len(mean)} channels, the images "
                             f"{args.num_channels} (--num_channels)")
        logger.info("normalizing as the pretrained weights were trained: mean %s, std %s", mean, std)
    else:
        mean, std = _statistics(spec, train_images)
    train_transform = BatchTransform(
        mean,
        std,
        augment=args.augment,
        hflip=spec.hflip if args.hflip is None else args.hflip,
        cutout=spec.cutout if args.cutout is None else args.cutout,
        seed=seed,
    )
    noisy = ids[noisy]  # flip_labels gives positions; the record keeps ids (they differ under --classes)
    holdout = None
    if args.holdout_fraction:
        positions = torch.arange(len(ids))
        held = holdout_positions(len(ids), args.holdout_fraction, args.holdout_seed)
        rows = held if args.train_on == "holdout" else positions[~torch.isin(positions, held)]
        holdout = ids[held]
        logger.info("holdout: %d of %d rows held out; training on %d (%s)", len(holdout), len(ids), len(rows),
                    args.train_on)
        train_images, train_labels, ids = train_images[rows], train_labels[rows], ids[rows]
        noisy = noisy[torch.isin(noisy, ids)]
    train = ImageTensorDataset(train_images, train_labels, train_transform, ids, index_column=index_column)
    train.noisy_indices = noisy

    evaluation = None
    if eval_split is not None:
        evaluation = ImageTensorDataset(
            _decode(eval_rows, image_column, args.num_channels, size, f"{source} [{args.eval_split}]"),
            eval_labels,
            BatchTransform(mean, std),
        )
    return ImageClassificationData(
        train=train,
        holdout_ids=holdout,
        eval=evaluation,
        label_names=label_names,
        mean=mean,
        std=std,
        image_size=size,
        num_channels=args.num_channels,
        spec=spec,
        source=source,
    )


def _split(splits: datasets.DatasetDict, name: str, flag: str, source: str) -> datasets.Dataset:
    if name not in splits:
        raise ValueError(f"{flag} {name!r} not found in {source}; its splits are {sorted(splits)}")
    return splits[name]


def _columns(split: datasets.Dataset, spec: DatasetSpec, args: DataArguments) -> tuple[str, str]:
    """The image and label columns: the flags, else the spec's, else detected from features."""
    features = split.features
    found = f"columns found: {list(features)}"
    for flag, name in (("--image_column", args.image_column), ("--label_column", args.label_column)):
        if name is not None and name not in features:
            raise ValueError(f"{flag} {name!r} is not a column of the dataset; {found}")

    image = args.image_column or _detect(
        features, spec.image_column, lambda f: isinstance(f, datasets.Image), ("image", "img")
    )
    holding_images = [name for name, feature in features.items() if isinstance(feature, datasets.Image)]
    # Advise --image_column only when some column holds images: otherwise every choice fails the same way.
    if holding_images:
        advice = f"pass --image_column with one of {holding_images}, the columns that hold images"
    else:
        advice = (
            "no column of the dataset holds images (a datasets.Image feature); cast the column of image files "
            "or bytes with dataset.cast_column(name, datasets.Image()), or load the images as an 'imagefolder'"
        )
    if image is None:
        raise ValueError(f"no image column found; {found}; {advice}")
    if not isinstance(features[image], datasets.Image):
        named = f"--image_column {image!r}" if args.image_column else f"column {image!r}"
        raise ValueError(f"{named} does not hold images ({features[image]}); {found}; {advice}")

    label = args.label_column or _detect(
        features, spec.label_column, lambda f: isinstance(f, datasets.ClassLabel), ("label", "labels", "fine_label")
    )
    if label is None:
        raise ValueError(f"no label column found; {found}; pass --label_column")
    return image, label


def _detect(features: datasets.Features, preferred: str | None, is_kind, names: tuple[str, ...]) -> str | None:
    if preferred in features:
        return preferred
    of_kind = [name for name, feature in features.items() if is_kind(feature)]
    if len(of_kind) == 1:
        return of_kind[0]
    return next((name for name in names if name in features), None)


def _check_columns(split: datasets.Dataset, columns: tuple[str, str], split_name: str) -> None:
    missing = [c for c in columns if c not in split.features]
    if missing:
        raise ValueError(f"split {split_name!r} lacks column(s) {missing}; columns found: {list(split.features)}")


def _keep_classes(
    rows: datasets.Dataset, labels: torch.Tensor, kept: list[int], flag: str
) -> tuple[torch.Tensor, datasets.Dataset, torch.Tensor]:
    """The positions, rows and relabelled labels (``kept[i]`` -> i) of the rows whose class is kept."""
    positions = torch.nonzero(torch.isin(labels, torch.tensor(kept)), as_tuple=True)[0]
    if len(positions) == 0:
        raise ValueError(f"{flag}: no row belongs to --classes {','.join(map(str, kept))}")
    lookup = torch.full((max(int(labels.max()), *kept) + 1,), -1, dtype=labels.dtype)
    lookup[torch.tensor(kept)] = torch.arange(len(kept), dtype=labels.dtype)
    return positions, rows.select(positions.tolist()), lookup[labels[positions]]


def _first(split: datasets.Dataset, count: int | None) -> datasets.Dataset:
    # A contiguous range selects without an indices mapping, before anything is decoded.
    return split if count is None or count >= len(split) else split.select(range(count))


def _decode(
    rows: datasets.Dataset, column: str, channels: int, size: tuple[int, int] | None, what: str
) -> torch.Tensor:
    if len(rows) == 0:
        raise ValueError(f"{what} has no rows")
    # Encoded cells straight from Arrow: {"bytes", "path"} dicts, nothing decoded by `datasets`.
    encoded = rows.select_columns(column).cast_column(column, datasets.Image(decode=False))
    cells = encoded.with_format("arrow")[column].to_pylist()
    images, resized = decode_images(cells, channels, size, where=f"{what}, image column {column!r}")
    if resized and size is None:
        logger.warning(
            "%s: %d images resized to %dx%d, the first image's size (choose with --image_size)",
            what,
            resized,
            *images.shape[2:],
        )
    return images


def _statistics(spec: DatasetSpec, images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The spec's mean/std (grayscale values repeat over RGB), else measured on ``images``."""
    channels = images.shape[1]
    if spec.mean is not None and len(spec.mean) in (1, channels):
        repeat = channels // len(spec.mean)
        return tuple(spec.mean) * repeat, tuple(spec.std) * repeat
    # One channel at a time: a float copy of a whole dataset can be gigabytes.
    std, mean = zip(*(torch.std_mean(images[:, c].float() / 255.0) for c in range(channels)), strict=True)
    return tuple(m.item() for m in mean), tuple(max(s.item(), 1e-6) for s in std)
