"""What the record's functions accept, checked where they are called: a wrong argument is named with what is
allowed, instead of surfacing as a raw error from datasets, numpy or torch several calls later (or, for ``top=-1``,
as an empty answer)."""

from __future__ import annotations

import numbers

import numpy


def _shown(value) -> str:
    if isinstance(value, str | numbers.Number) and len(repr(value)) <= 60:
        return f"{value!r} ({type(value).__name__})"
    kind = type(value)
    return f"a {kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else f"a {kind.__name__}"


def require_type(value, types, argument: str, expected: str) -> None:
    """TypeError naming ``argument`` unless ``value`` is one of ``types``; a bool is never a number here (True is 1
    to Python, never a meant share, seed or count)."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise TypeError(f"{argument} must be {expected}, got {_shown(value)}{_from_pandas(value)}")


def _from_pandas(value) -> str:
    if type(value).__name__ == "DataFrame":
        return ": datasets.Dataset.from_pandas(frame, preserve_index=False) converts a pandas DataFrame"
    return ""


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def check_choice(value, choices, argument: str) -> None:
    """``value`` must be a string among ``choices`` (TypeError, else ValueError), both naming ``argument``."""
    require_type(value, str, argument, f"a string, one of {', '.join(choices)}")
    if value not in choices:
        raise ValueError(f"{argument} must be one of {', '.join(choices)}, got {value!r}")


def check_top(top) -> None:
    """``top``: None (the flagged rows) or a positive count of rows."""
    require_type(top, (numbers.Integral, type(None)), "top", "None or a positive integer (how many rows)")
    if top is not None and top < 1:
        raise ValueError(f"top must be a positive number of rows (or None for the flagged ones), got {top}")


def check_keep(keep) -> None:
    """``keep`` (``--sb_subset_keep``): a share of the training set in (0, 1]."""
    require_type(keep, numbers.Real, "keep (--sb_subset_keep)", "a number in (0, 1]: the share of examples kept")
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep (--sb_subset_keep) must be in (0, 1] (the share of the training set kept), got {keep}")


def check_has_rows(rows: int, where: str) -> None:
    if rows == 0:
        raise ValueError(f"{where} holds no example: a record has one row per example training scored or "
                         "backpropagated; train with --sb_record (the default) to write one")


def check_columns(column_names: list[str], needed, where: str, why: str) -> None:
    """Refuse a table without every column in ``needed``, naming them; ``why`` says what needs them."""
    missing = [name for name in needed if name not in column_names]
    if missing:
        raise ValueError(f"{where} has no {missing} column(s), which {why} (its columns: {column_names})")


def check_unique_ids(ids: numpy.ndarray, id_column: str, where: str) -> None:
    """A record holds one row per example: two rows under one id would count that example twice."""
    unique, counts = numpy.unique(ids, return_counts=True)
    if unique.size != ids.size:
        repeated = unique[counts > 1]
        raise ValueError(f"{where} holds {ids.size - unique.size} duplicate ids in its {id_column!r} column (e.g. "
                         f"{repeated[0].item()!r}, {int(counts[counts > 1][0])} times): a record keys one row per "
                         "example, so it cannot say which row is that example's")
