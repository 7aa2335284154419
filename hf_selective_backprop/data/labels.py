"""A classification dataset's label column: its classes (declared by a ClassLabel, --num_labels or the ids found),
its values checked against them, and the messages that name the offending rows."""

from __future__ import annotations

import logging

import datasets
import numpy as np
import torch

from .arguments import DataArguments

logger = logging.getLogger(__name__)


def label_names_of(
    train: datasets.Dataset, evaluation: datasets.Dataset | None, args: DataArguments, column: str
) -> tuple[list[str], str]:
    """The class names (the column's ClassLabel names, else ``--num_labels`` ids, else the ids
    found in the column) and which of the three declared them."""
    feature = train.features[column]
    if isinstance(feature, datasets.ClassLabel):
        if args.num_labels is not None and args.num_labels != feature.num_classes:
            raise ValueError(
                f"--num_labels {args.num_labels} disagrees with label column {column!r}, which declares "
                f"{feature.num_classes} classes ({preview(feature.names)}); drop --num_labels"
            )
        return list(feature.names), f"the ClassLabel names of column {column!r}"
    if not (isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))):
        raise ValueError(
            f"label column {column!r} holds {feature}, not class ids (a ClassLabel or integers); pass --label_column"
        )
    if args.num_labels is not None:
        return [str(label) for label in range(args.num_labels)], f"--num_labels {args.num_labels}"

    # Inferred from every row of the used splits, not only the first --max_*_samples, so a
    # subset does not change the model's classes.
    used = {f"--train_split {args.train_split!r}": train}
    if evaluation is not None:
        used[f"--eval_split {args.eval_split!r}"] = evaluation
    labels = {name: label_array(split, column, name) for name, split in used.items()}
    ids = np.unique(np.concatenate(list(labels.values())))
    ids = ids[ids >= 0]  # negative labels are reported with their rows by _labels
    if len(ids) == 0:
        raise ValueError(f"label column {column!r} holds no class id >= 0; pass --label_column")
    num_classes = int(ids[-1]) + 1
    if len(ids) < num_classes:
        # One stray id (11 among 0..9) would otherwise build a 12-class model without a word.
        missing = np.setdiff1d(np.arange(num_classes), ids)
        above = {name: values > missing[0] for name, values in labels.items()}
        where = "; ".join(f"{name}: {offending_rows(labels[name], mask)}" for name, mask in above.items() if mask.any())
        occur = "never occurs" if len(missing) == 1 else "never occur"
        raise ValueError(
            f"label column {column!r} holds the integer ids {preview(ids.tolist())}, not the contiguous "
            f"0..{num_classes - 1}: {preview(missing.tolist())} {occur}, so {num_classes} classes would be "
            f"inferred, some without any example. Labels above the first missing id: {where}. Fix those "
            f"labels, or pass --num_labels {num_classes} if those classes are meant to exist"
        )
    warn_of_rare_classes(labels, column)
    logger.info(
        "label column %r: %d classes inferred from its integer ids 0..%d in %s (--num_labels sets them)",
        column,
        num_classes,
        num_classes - 1,
        " and ".join(used),
    )
    return [str(label) for label in range(num_classes)], f"the ids found in column {column!r}"


def kept_label_names(label_names: list[str], kept: list[int]) -> list[str]:
    unknown = [class_id for class_id in kept if class_id >= len(label_names)]
    if unknown:
        raise ValueError(
            f"--classes names {preview(unknown)}, but the dataset has {len(label_names)} classes "
            f"(ids 0..{len(label_names) - 1}: {preview(label_names)})"
        )
    return [label_names[class_id] for class_id in kept]


def class_ids(rows: datasets.Dataset, column: str, label_names: list[str], declared_by: str, what: str) -> torch.Tensor:
    """The label column of ``rows`` as class ids, each checked to be one of ``label_names``' positions."""
    labels = label_array(rows, column, what)
    num_classes = len(label_names)
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        remedy = ", or raise --num_labels" if declared_by.startswith("--num_labels") else ""
        raise ValueError(
            f"{what}, label column {column!r}: labels must be class ids in [0, {num_classes - 1}] "
            f"({num_classes} classes, from {declared_by}: {preview(label_names)}), found "
            f"{offending_rows(labels, bad)}; fix or drop those rows{remedy}"
        )
    return torch.from_numpy(labels)


def label_array(rows: datasets.Dataset, column: str, what: str) -> np.ndarray:
    values = rows.with_format("arrow")[column]
    if values.null_count:
        missing = np.flatnonzero(values.is_null().to_numpy())
        noun = "rows" if len(missing) > 1 else "row"
        raise ValueError(
            f"{what}, label column {column!r}: no label at {noun} {preview(missing.tolist())}; fix or drop that {noun}"
        )
    return values.to_numpy().astype(np.int64)


#: A class with at most this share of the median class's examples is named in a warning: one stray label
#: (10 among 0..9) would otherwise add a class to the model with only an info-level notice.
RARE_CLASS_SHARE = 0.01


def warn_of_rare_classes(labels: dict[str, np.ndarray], column: str) -> None:
    """Warn, naming the rows, of classes with almost no example (``labels``: each split's label ids by its name)."""
    values = np.concatenate(list(labels.values()))
    counts = np.bincount(values[values >= 0])
    rare = np.flatnonzero(counts <= max(1.0, RARE_CLASS_SHARE * float(np.median(counts))))
    if len(counts) > 2 and len(rare):
        in_rare = {name: np.isin(split, rare) for name, split in labels.items()}
        where = "; ".join(f"{name}: {offending_rows(labels[name], mask)}"
                          for name, mask in in_rare.items() if mask.any())
        logger.warning(
            "label column %r: class(es) %s have %s example(s) against a median of %d per class, and each becomes an "
            "output of the model: a stray label? %s. Fix those rows, or pass --num_labels to state the classes",
            column, preview(rare.tolist()), preview(counts[rare].tolist()), int(np.median(counts)), where,
        )


def offending_rows(labels: np.ndarray, bad: np.ndarray, shown: int = 5) -> str:
    """'row 5 = 11, row 9 = 12 (2 rows)': rows are positions in the split, counted from 0."""
    rows = np.flatnonzero(bad)
    listed = ", ".join(f"row {row} = {labels[row]}" for row in rows[:shown])
    return f"{listed}{', ...' if len(rows) > shown else ''} ({len(rows)} row{'s' if len(rows) > 1 else ''})"


def preview(values: list, shown: int = 12) -> str:
    listed = ", ".join(str(value) for value in values[:shown])
    return listed + (f", ... ({len(values)} in all)" if len(values) > shown else "")
