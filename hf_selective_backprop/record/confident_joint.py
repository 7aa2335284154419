"""How many labels of each class look wrong, estimated from one run's record as confident learning does
(Northcutt, Jiang and Chuang, 2021, "Confident Learning: Estimating Uncertainty in Dataset Labels").

Confident learning counts an example labelled i as "confidently j" when its predicted p(j) reaches class j's
threshold t_j, the mean p(j) over the examples labelled j; the counts of the (i, j) cells, calibrated so that each
row sums to the examples labelled i, give how many of class i's labels are wrong (the off-diagonal mass). It asks
for out-of-sample probabilities (K trainings for K-fold cross-validation); here each example's mean p(gold) over
the run's scorings (the data map's confidence) stands in, from the one run that trained.

The record keeps p(gold) and the margin (gold logit minus the largest other), not every class's probability: with
two classes p(j) = 1 - p(i), and the count is confident learning's own. With more, the likeliest other class's p is
p(gold) x exp(-margin) at a scoring; from the run's means (confidence, area under the margin) it is estimated as
confidence x exp(-aum), at most 1 - confidence (all of the rest, where the record has no margins). Which class that
is the record does not say, so it is compared with the lowest other class's threshold: the estimate leans high. An
example passing both its own and another threshold goes to the likelier side, as confident learning assigns it to
the larger probability.
"""

from __future__ import annotations

import numpy


def estimated_label_issues(confidence: numpy.ndarray, labels: numpy.ndarray,
                           other: numpy.ndarray | None = None) -> dict[int, int]:
    """Per class label, how many of the examples labelled so hold a wrong label (rounded); ``confidence``: each
    example's mean p(gold) (NaN: never scored), ``labels``: its class label (negative: unknown); ``other``: each
    example's p of its likeliest other class, where known (default 1 - confidence, exact for two classes).
    Examples never scored or unlabelled take no part."""
    if other is None:
        other = 1 - confidence
    known = ~numpy.isnan(confidence) & (labels >= 0)
    classes = numpy.unique(labels[known])
    thresholds = {int(c): float(confidence[known & (labels == c)].mean()) for c in classes}
    estimates = {}
    for label in thresholds:
        own = confidence[known & (labels == label)]
        rest = other[known & (labels == label)]
        others = [t for c, t in thresholds.items() if c != label]
        if not others:  # one class seen: no other class to be confidently
            estimates[label] = 0
            continue
        confident_own = own >= thresholds[label]
        confident_other = rest >= min(others)
        both = confident_own & confident_other
        confident_own &= ~(both & (own < rest))
        confident_other &= ~(both & (own >= rest))
        counted = int(confident_own.sum() + confident_other.sum())
        estimates[label] = round(own.size * int(confident_other.sum()) / counted) if counted else 0
    return estimates


def first_of_each_class(order: numpy.ndarray, labels: numpy.ndarray, quota: dict[int, int],
                        eligible: numpy.ndarray) -> numpy.ndarray:
    """The positions of ``order`` that are among the first ``quota[c]`` eligible positions of their class c, in
    ``order``'s order."""
    taken = numpy.zeros(len(order), dtype=bool)
    ordered_labels = labels[order]
    ordered_eligible = eligible[order]
    for label, count in quota.items():
        candidates = numpy.flatnonzero(ordered_eligible & (ordered_labels == label))[:count]
        taken[candidates] = True
    return order[taken]
