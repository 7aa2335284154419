"""Each example's class label, kept in the record's table: per-class questions (how many labels look wrong in
each class, `confident_joint.estimated_label_issues`) need no join back to the dataset."""

from __future__ import annotations

import numpy
from torch.utils.data import IterableDataset

from .fingerprint import ids_at, labels_at

#: Where a classifier's class label is, in the order looked for.
CLASS_LABEL_COLUMNS = ("labels", "label", "label_ids")
#: The table's column of class labels; -1 where an example's label is unknown.
LABEL_COLUMN = "label"


def class_labels(dataset, id_column: str) -> tuple[numpy.ndarray, numpy.ndarray] | None:
    """(ids, class labels) of every example of ``dataset``, read without loading rows (a `datasets.Dataset`'s
    column, a dataset's ``labels`` tensor: reading a torch dataset's rows may augment them); None where they cannot
    be read so, or are not one class id per example (multi-label rows, tokens)."""
    if dataset is None or isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not len(dataset):
        return None
    positions = list(range(len(dataset)))
    labelled = labels_at(dataset, positions, CLASS_LABEL_COLUMNS)
    if labelled is None:
        return None
    try:
        labels = numpy.asarray(labelled[1])
    except ValueError:  # ragged: a label per token
        return None
    if labels.ndim != 1 or labels.dtype.kind not in "iu":  # one integer per example (not bools, floats or lists)
        return None
    ids = ids_at(dataset, id_column, positions)
    if ids is None:
        return None
    return numpy.asarray(ids, dtype=numpy.int64), labels.astype(numpy.int64)


def labels_of(ids: numpy.ndarray, known: tuple[numpy.ndarray, numpy.ndarray]) -> numpy.ndarray:
    """The class label of each of ``ids`` in ``known`` (`class_labels`), -1 for an id it does not hold."""
    known_ids, known_labels = known
    result = numpy.full(len(ids), -1, dtype=numpy.int64)
    if len(known_ids):
        order = numpy.argsort(known_ids)
        sorted_ids = known_ids[order]
        where = numpy.searchsorted(sorted_ids, ids).clip(max=len(sorted_ids) - 1)
        found = sorted_ids[where] == ids
        result[found] = known_labels[order][where[found]]
    return result
