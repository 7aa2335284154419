"""How well a ranking of suspected label issues finds the labels known to be flipped."""

from __future__ import annotations

import numpy


def auroc(scores: numpy.ndarray, positives: numpy.ndarray) -> float:
    """The probability that a positive ranks above a negative (ties count half): Mann-Whitney's U over n+ n-."""
    order = numpy.argsort(scores, kind="stable")
    ranks = numpy.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks over ties.
    _, first, counts = numpy.unique(sorted_scores, return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):
        ranks[order[start:start + count]] = start + (count + 1) / 2
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def precision_at_flips(suspicion: numpy.ndarray, flipped: numpy.ndarray) -> float:
    """The share flipped among the as many most suspect rows as there are flips (ties: the lower position first)."""
    top = numpy.argsort(-suspicion, kind="stable")[: int(flipped.sum())]
    return float(flipped[top].mean())


def ranking_metrics(suspicion: numpy.ndarray, flagged: numpy.ndarray, flipped: numpy.ndarray) -> dict:
    """``suspicion``: higher = likelier mislabeled; ``flagged``: the method's own flagged set (bool)."""
    return {
        "precision_at_flips": precision_at_flips(suspicion, flipped),
        "flagged": int(flagged.sum()),
        "precision_flagged": float(flipped[flagged].mean()) if flagged.any() else None,
        "recall_flagged": float(flagged[flipped].mean()),
        "auroc": auroc(suspicion, flipped),
    }
