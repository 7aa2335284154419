"""Per-example scores from an `ExampleRecord`: the record's table, the data map's regions, label-issue candidates
and the subset of a dataset a score keeps.

Definitions follow Dataset Cartography (Swayamdipta et al., 2020) with the losses training already computed in
place of a separate pass after each epoch: *confidence* is the mean of ``exp(-loss)`` over the example's scorings
(p(gold label) for cross-entropy), *variability* its standard deviation, *correctness* the share of scorings at
which it was learned (p(gold) > 1/2). *aum* is the area under the margin (Pleiss et al., 2020): the mean over the
example's scorings of its gold logit minus the largest other logit, for single-label classification.
"""

from __future__ import annotations

import torch

from .table import LEARNED_BELOW, ExampleRecord

#: The data map's regions. Ambiguous: the most variable third of the scored examples (Cartography's choice);
#: of the others, easy when their gold label holds most of the probability on average, hard otherwise.
EASY, AMBIGUOUS, HARD = "easy-to-learn", "ambiguous", "hard-to-learn"
AMBIGUOUS_SHARE = 1 / 3

#: Scores a subset can be chosen by: each keeps the examples with the highest value.
PRUNE_SCORES = {
    "mean_loss": "the hardest on average (highest mean loss)",
    "first_loss": "the hardest at their first scoring (early-training loss, as Data Diet scores early)",
    "confidence": "the easiest (highest mean p(gold)); it drops the likeliest label issues first",
    "variability": "the most ambiguous (highest variability, Cartography's choice)",
    "forgetting_events": "the most forgotten (forgetting events, Toneva et al.)",
    "label_issues": "all but the likeliest label issues (the lowest loss at the last scoring, so the examples "
                    "record.label_issues ranks first are dropped first)",
    "coverage": "every level of difficulty (mean loss), after CCS (Zheng et al., ICLR 2023): the hardest tenth "
                "dropped as likely label issues, the rest split into strata of equal width, each filled evenly",
    "class_budget": "each class's share set by its difficulty (its winsorized mean loss), after NUCS (Zhang et al., "
                    "2025), chosen by coverage inside each class; reads the training set's class labels",
    "random": "a uniform-random subset of the same size: the control every score must beat",
}
#: Scores read from another column of the record, and the sign that makes the kept examples the highest.
_PRUNE_COLUMNS = {"label_issues": ("last_loss", -1.0), "coverage": ("mean_loss", 1.0),
                  "class_budget": ("mean_loss", 1.0)}


#: The columns a record holds after its id column, in the order it writes them; `ADDED_LATER` an earlier version's
#: record lacks (each function that reads one of them says so by name).
RECORD_COLUMNS = (
    "times_scored", "times_backpropagated", "mean_loss", "first_loss", "last_loss", "confidence", "variability",
    "correctness", "aum", "forgetting_events", "first_scored_epoch", "last_scored_epoch", "first_learned_epoch",
    "nonfinite_losses", "region",
)  # fmt: skip
ADDED_LATER = ("aum",)


def prune_column(by: str) -> tuple[str, float]:
    """The record column ``by`` (a `PRUNE_SCORES` name other than random) is read from, and its sign."""
    return _PRUNE_COLUMNS.get(by, (by, 1.0))


def record_columns(record: ExampleRecord) -> dict[str, torch.Tensor]:
    """One entry per example training saw (ascending id): counts, losses, epochs and the derived scores."""
    ids = record.seen
    times = record["times_scored"][ids].to(torch.float64)
    scored = times > 0
    n = times.clamp(min=1)
    confidence = record["confidence_sum"][ids] / n
    variance = (record["confidence_sq_sum"][ids] / n - confidence * confidence).clamp(min=0)
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    columns = {
        "id": ids,
        "times_scored": record["times_scored"][ids],
        "times_backpropagated": record["times_backpropagated"][ids],
        "mean_loss": torch.where(scored, record["loss_sum"][ids] / n, nan).float(),
        "first_loss": record["first_loss"][ids],
        "last_loss": record["last_loss"][ids],
        "confidence": torch.where(scored, confidence, nan).float(),
        "variability": torch.where(scored, variance.sqrt(), nan).float(),
        "correctness": torch.where(scored, record["times_learned"][ids] / n, nan).float(),
        "aum": torch.where(record["times_margined"][ids] > 0,
                           record["margin_sum"][ids] / record["times_margined"][ids].clamp(min=1), nan).float(),
        "forgetting_events": record["forgetting_events"][ids],
        "first_scored_epoch": record["first_scored_epoch"][ids],
        "last_scored_epoch": record["last_scored_epoch"][ids],
        "first_learned_epoch": record["first_learned_epoch"][ids],
        "nonfinite_losses": record["nonfinite_losses"][ids],
    }
    columns["region"] = regions(columns["confidence"], columns["variability"])
    return columns


def regions(confidence: torch.Tensor, variability: torch.Tensor) -> list[str | None]:
    """Each example's data-map region (None where it was never scored)."""
    known = ~torch.isnan(confidence)
    threshold = float("inf")
    if bool(known.any()):
        threshold = float(torch.quantile(variability[known].double(), 1 - AMBIGUOUS_SHARE))
    names = []
    for conf, var, is_known in zip(confidence.tolist(), variability.tolist(), known.tolist(), strict=True):
        if not is_known:
            names.append(None)
        elif var > threshold:  # strict: a record of one scoring each (variability 0) has no ambiguous examples
            names.append(AMBIGUOUS)
        else:
            names.append(EASY if conf >= 0.5 else HARD)
    return names


#: The orders `label_issue_order` ranks by, likeliest label issue first.
LABEL_ISSUE_RANKINGS = {
    "mean_loss": "highest mean loss first: -log p(gold) keeps a label the model never fits far ahead of a hard "
                 "example it fits late (O2U-Net's average loss, Huang et al., 2019)",
    "last_loss": "highest loss at the last scoring first: the final model's view, which a short run has not yet "
                 "spent on fitting the wrong labels",
    "confidence": "lowest mean confidence first, then lowest variability: the hard-to-learn corner of the data map, "
                  "where Cartography found most mislabeled examples",
    "aum": "lowest area under the margin first (Pleiss et al., 2020): a label the model keeps preferring another "
           "class to; single-label classification only",
}


def label_issue_flags(columns: dict[str, torch.Tensor], by: str) -> torch.Tensor:
    """The rows ``by`` flags as label issues: those its score says the model did not learn (p(gold) under 1/2 at the
    last scoring, by the mean loss or by the mean confidence; a negative margin for aum). A threshold on the score
    `label_issue_order` sorts by, so the flagged rows are that order's first ones; unscored (NaN) rows never are."""
    if by == "aum":
        return columns["aum"] < 0
    if by == "confidence":
        return columns["confidence"] < 0.5
    return columns[by] > LEARNED_BELOW


def label_issue_order(columns: dict[str, torch.Tensor], by: str) -> torch.Tensor:
    """Positions ranked from likeliest label issue by ``by`` (`LABEL_ISSUE_RANKINGS`); unscored (NaN) last."""
    if by in ("mean_loss", "last_loss", "aum"):
        suspicion = columns[by].double() * (-1.0 if by == "aum" else 1.0)
        return torch.argsort(torch.nan_to_num(suspicion, nan=float("-inf")), descending=True, stable=True)
    confidence = torch.nan_to_num(columns["confidence"].double(), nan=float("inf"))
    by_variability = torch.argsort(columns["variability"], stable=True)
    return by_variability[torch.argsort(confidence[by_variability], stable=True)]


def keep_order(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Positions from most to least worth keeping: highest score first, ties in a random order, unscored (NaN)
    last. A random ``scores`` (the control) is a plain permutation."""
    shuffled = torch.randperm(scores.numel(), generator=generator)
    values = scores[shuffled].to(torch.float64)
    values = torch.where(torch.isnan(values), torch.tensor(float("-inf"), dtype=torch.float64), values)
    return shuffled[torch.argsort(values, descending=True, stable=True)]
