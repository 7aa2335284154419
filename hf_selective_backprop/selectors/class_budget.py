"""Class-aware budgets (NUCS, Zhang et al., 2025, arXiv:2504.13234): each class keeps a share set by its difficulty.

A subset chosen over all classes at once, by hardness or by coverage, takes from each class what its examples'
scores give it: a hard class keeps most of its examples and an easy one few or none, so at half the data or less
the easy classes are the ones the pruned run forgets. NUCS ("Non-Uniform Class-Wise Coreset Selection") budgets
the subset class by class first, then chooses inside each class:

- a class's difficulty is the winsorized mean of its examples' scores (its scores clipped to the class's 5th and
  95th percentiles, then averaged: a few mislabeled examples with huge losses do not make a class hard);
- a class's kept share is proportional to its difficulty (NUCS's selection ratio r_c = (1 - alpha) S_c / T, with
  T making the budgets sum to the kept count), so class c keeps about count x n_c S_c / sum_j n_j S_j examples:
  on balanced classes, budgets proportional to difficulty;
- every class keeps at least a quarter of its even share (count x n_c / n, and at least one example where the
  count allows) and at most all of its examples; what a capped class cannot take goes to the others, in
  proportion to their difficulty again;
- inside a class the budget is chosen by coverage (CCS, `coverage_choice`): the hardest tenth dropped as likely
  label issues, the rest covered stratum by stratum.

What NUCS itself does inside a class is keep a window of difficulty whose end it tunes on a proxy (a kernel
model over the examples' features); this package has the losses and nothing else, so CCS stands in for the
window: its hard cutoff is the window's upper end and its strata keep the easier part the window keeps. The rule
above is taken from the paper's abstract (class difficulty as a winsorized average of per-example scores,
budgets non-uniform by difficulty, selection within a difficulty range) and from its allocation formula as a
public reimplementation states it; the winsorizing limits and the floor are this package's choices, not the
paper's (its full method section was not at hand).

Examples without a label (negative) are kept first, as `coverage_choice` keeps examples without a score: nothing
is known of them. Unscored examples (NaN) of a labeled class count in its size and are kept first inside it.
"""

from __future__ import annotations

import torch

from .coverage import coverage_choice

#: Each class's difficulty is the mean of its scores clipped to these quantiles of the class (winsorized).
CLASS_BUDGET_WINSOR = 0.05
#: Each class keeps at least this share of its even (class-size proportional) share of the kept count.
CLASS_BUDGET_FLOOR = 0.25


def class_budget_choice(scores: torch.Tensor, labels: torch.Tensor, count: int, generator: torch.Generator,
                        floor: float = CLASS_BUDGET_FLOOR, winsor: float = CLASS_BUDGET_WINSOR) -> torch.Tensor:
    """``count`` positions of ``scores`` (higher: harder; non-negative, e.g. losses) chosen by NUCS's class
    budgets (`class_budgets`), by coverage inside each class, ascending. ``labels[i]`` is position i's class (an
    integer; negative: unknown)."""
    values = scores.detach().reshape(-1).double().cpu()
    labels = labels.detach().reshape(-1).cpu()
    if labels.numel() != values.numel():
        raise ValueError(f"{labels.numel()} labels for {values.numel()} scores")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer class labels, got dtype {labels.dtype}")
    if not 0 <= count <= values.numel():
        raise ValueError(f"count must be in [0, {values.numel()}], got {count}")
    labels = labels.long()
    unlabeled = torch.nonzero(labels < 0).flatten()
    if unlabeled.numel() >= count:
        return torch.sort(unlabeled[torch.randperm(unlabeled.numel(), generator=generator)[:count]]).values
    classes = torch.unique(labels[labels >= 0])  # ascending: the order the generator is drawn in
    members = [torch.nonzero(labels == c).flatten() for c in classes.tolist()]
    budgets = class_budgets(values, labels, count - unlabeled.numel(), floor, winsor)
    chosen = [unlabeled]
    for positions, budget in zip(members, budgets.tolist(), strict=True):
        chosen.append(positions[coverage_choice(values[positions], budget, generator)])
    return torch.sort(torch.cat(chosen)).values


def class_difficulties(scores: torch.Tensor, labels: torch.Tensor, winsor: float = CLASS_BUDGET_WINSOR
                       ) -> torch.Tensor:
    """Each labeled class's difficulty (ascending class order): the winsorized mean of its finite scores. A class
    without any takes the mean of the others' (nothing says it is easy or hard); no class with any: all 1."""
    if not 0.0 <= winsor < 0.5:
        raise ValueError(f"winsor must be in [0, 0.5), got {winsor}")
    values = scores.detach().reshape(-1).double().cpu()
    labels = labels.detach().reshape(-1).cpu().long()
    classes = torch.unique(labels[labels >= 0])
    difficulty = torch.full((classes.numel(),), float("nan"), dtype=torch.float64)
    for index, c in enumerate(classes.tolist()):
        own = values[labels == c]
        own = own[torch.isfinite(own)]
        if own.numel():
            low, high = torch.quantile(own, torch.tensor([winsor, 1.0 - winsor], dtype=torch.float64)).tolist()
            difficulty[index] = own.clamp(low, high).mean()
    known = ~torch.isnan(difficulty)
    if not bool(known.any()):
        return torch.ones_like(difficulty)
    return torch.where(known, difficulty, difficulty[known].mean())


def class_budgets(scores: torch.Tensor, labels: torch.Tensor, count: int, floor: float = CLASS_BUDGET_FLOOR,
                  winsor: float = CLASS_BUDGET_WINSOR) -> torch.Tensor:
    """How many of ``count`` examples each labeled class keeps (ascending class order; negative labels are no
    class): in proportion to class size x difficulty (`class_difficulties`), at least ``floor`` x its even share
    (and, with a floor above 0, one example where ``count`` covers one per class), at most its size; they sum to
    ``count``."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor}")
    labels = labels.detach().reshape(-1).cpu().long()
    classes, sizes = torch.unique(labels[labels >= 0], return_counts=True)
    total = int(sizes.sum())
    if not 0 <= count <= total:
        raise ValueError(f"count must be in [0, {total}] (the labeled examples), got {count}")
    sizes = sizes.double()
    difficulty = class_difficulties(scores, labels, winsor)
    difficulty = difficulty - min(float(difficulty.min()), 0.0)  # a proportion needs no negative weight
    weights = sizes * difficulty
    if float(weights.sum()) <= 0.0:
        weights = sizes.clone()  # no class harder than another: shares by size alone
    even = count * sizes / total
    lower = torch.minimum((floor * even).floor().clamp(min=1.0 if floor > 0 else 0.0), sizes)
    if float(lower.sum()) > count:  # more classes than kept examples: the quarter of each even share alone
        lower = torch.minimum((floor * even).floor(), sizes)
    shares = _capped_proportional(weights, lower, sizes, count)
    return _whole(shares, lower, sizes, count)


def _capped_proportional(weights: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, total: int
                         ) -> torch.Tensor:
    """Real shares in proportion to ``weights``, each clipped into [lower, upper], summing to ``total``: the
    classes that overshoot a bound are fixed at it (those on the side that overshoots more first, which the
    solution keeps there) and the rest shared again, at most once per class."""
    shares = torch.zeros_like(weights)
    free = torch.ones_like(weights, dtype=torch.bool)
    while bool(free.any()):
        left = total - float(shares[~free].sum())
        weight = torch.where(free, weights, torch.zeros_like(weights))
        if float(weight.sum()) <= 0.0:
            weight = torch.where(free, upper, torch.zeros_like(upper))  # only weightless classes left: by size
        proposal = left * weight / float(weight.sum())
        over, under = free & (proposal > upper), free & (proposal < lower)
        if not bool(over.any() or under.any()):
            shares[free] = proposal[free]
            break
        excess, deficit = float((proposal - upper)[over].sum()), float((lower - proposal)[under].sum())
        fixed, bound = (over, upper) if excess >= deficit else (under, lower)
        shares[fixed] = bound[fixed]
        free &= ~fixed
    return torch.minimum(torch.maximum(shares, lower), upper)


def _whole(shares: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, total: int) -> torch.Tensor:
    """Whole budgets from real ``shares``: each rounded down, then one more for the largest remainders (ties: the
    lower class), never past a class's size, until they sum to ``total``."""
    budgets = shares.floor().clamp(min=lower, max=upper)
    remainder = shares - budgets
    for index in torch.argsort(-remainder, stable=True).tolist():
        if int(budgets.sum()) >= total:
            break
        if budgets[index] < upper[index]:
            budgets[index] += 1
    while int(budgets.sum()) < total:  # rounding drift only: fill the classes with room, in class order
        budgets[int(torch.nonzero(budgets < upper).flatten()[0])] += 1
    while int(budgets.sum()) > total:
        budgets[int(torch.nonzero(budgets > lower).flatten()[-1])] -= 1
    return budgets.long()


def class_labels(labels: torch.Tensor | None, flag: str) -> torch.Tensor:
    """A batch's ``labels`` as one class per example, or a ValueError naming ``flag`` (the setting that budgets by
    class) where they are not: token-level labels (a language model's, a token classifier's), several labels per
    example, or real-valued targets. Reads the tensor's shape and dtype only: no wait for a device."""
    if labels is None or not torch.is_tensor(labels):
        raise ValueError(f"{flag} budgets the kept share class by class and needs each training example's class "
                         f"label, but the training batches hold none")
    if labels.dim() != 1 or labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(class_labels_refusal(flag, f"labels of dtype {labels.dtype} and shape "
                                              f"{tuple(labels.shape)}"))
    return labels


def class_labels_refusal(flag: str, what: str) -> str:
    """The error of ``flag`` (a setting that budgets by class) for labels that are not one class per example."""
    return (f"{flag} budgets the kept share class by class (NUCS) and needs one integer class label per example; "
            f"this run has {what} (token-level labels of a language model or token classifier, several labels per "
            "example, or real-valued targets have no class to budget). Choose by coverage without classes "
            "instead: --sb_strategy early_coverage, or --sb_subset_by coverage")


def refuse_token_labels(task: str, flag: str) -> None:
    """Refuse, when the trainer is built, class budgets (``flag``) for a model whose loss reads a label per token
    (``task``, `losses.model_task`: a causal or sequence-to-sequence language model, a token classifier)."""
    if task != "classification":
        raise ValueError(class_labels_refusal(flag, f"a {task} model, whose labels are one per token"))
