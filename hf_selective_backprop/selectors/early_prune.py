"""Early pruning inside one run: train on everything for an epoch, which gives every example a loss, then rank the
examples once and train the remaining epochs on a fixed share of them.

This prunes as Data Diet does (Paul et al., NeurIPS 2021: examples ranked by their difficulty early in training, by
the error's norm there and by the loss here, the hardest kept) without the second run: the first epoch is both the
scoring and the start of training, so the scoring costs nothing extra. ``by="coverage"`` chooses the share by
coverage instead of hardness (CCS, Zheng et al., ICLR 2023; coverage.py): hard-only subsets collapse at high
pruning rates. ``by="class_budget"`` first gives each class a share of it set by the class's difficulty, then
chooses by coverage inside each class (NUCS, Zhang et al., 2025; class_budget.py): it reads each example's class
label, which the trainer stores beside its loss. ``by="random"`` keeps a random subset of the same size, chosen at
the same point: the control the rankings have to beat. With ``anneal_delta`` below 1 the epochs from that share of
the run on train everything again, as InfoBatch anneals (Qin et al., ICLR 2024): the last epochs see the examples
the subset leaves out.
"""

from __future__ import annotations

import logging
import math

import torch

from .base import Selection, Selector
from .class_budget import class_budget_choice
from .coverage import coverage_choice
from .topk import check_keep, keep_count

EARLY_PRUNE_RANKINGS = ("loss", "coverage", "random", "class_budget")
#: The share of ln(K) from which a classifier's mean first-epoch loss reads as an answer at chance.
AT_CHANCE = 0.9

logger = logging.getLogger(__name__)


class EarlyPruneSelector(Selector):
    """Keeps every example until a plan sees stored losses; then, once, the ``keep`` share with the highest latest
    training-forward loss (``by="loss"``), a coverage-centric share over those losses (``by="coverage"``), that
    share budgeted class by class by the classes' difficulty (``by="class_budget"``: it reads each example's
    stored class label, ``uses_stored_labels``) or a random share of that size (``by="random"``), for every later
    epoch.

    The scores are the losses the trainer stores for every trained example (``uses_stored_losses``), so there is no
    selection forward. Examples the first epoch did not train (no stored loss) rank first: nothing says they are
    easy. The kept positions are the strategy's state (a checkpoint holds them), so a resumed run trains the same
    subset. ``full_epochs`` is the number of epochs that train everything before the first plan that sees losses
    (1 without ``--sb_warmup_epochs``, 0 with it: warm-up epochs are sized by the run already); with
    ``num_epochs`` it sizes the schedule. Epochs at or after ``anneal_delta`` x ``num_epochs`` train every example
    (1, the default: none do).
    """

    needs_losses = False
    uses_stored_losses = True
    #: ln(K) for a K-class classifier (the trainer sets it; None for other models): the cross-entropy of an answer
    #: at chance, near which a ranking by loss is close to a random choice.
    chance_loss: float | None = None

    def __init__(self, keep: float, by: str, num_epochs: float, full_epochs: int = 1, anneal_delta: float = 1.0):
        if by not in EARLY_PRUNE_RANKINGS:
            raise ValueError(f"by must be one of {', '.join(EARLY_PRUNE_RANKINGS)}, got {by!r}")
        if not 0.0 <= anneal_delta <= 1.0:
            raise ValueError(f"anneal_delta must be in [0, 1], got {anneal_delta}")
        self.anneal_delta = anneal_delta
        self.keep = check_keep(keep)
        self.by = by
        #: Class budgets read each example's class label, which the trainer then stores beside its loss.
        self.uses_stored_labels = by == "class_budget"
        self.num_epochs = num_epochs
        self.full_epochs = full_epochs
        #: Positions trained in every epoch after the choice; None until stored losses are seen.
        self.kept: torch.Tensor | None = None
        self._warn_if_nothing_is_pruned()

    def fit_run(self, num_epochs: float) -> None:
        self.num_epochs = num_epochs
        self._warn_if_nothing_is_pruned()

    def _warn_if_nothing_is_pruned(self) -> None:
        if self.full_epochs and self.num_epochs <= self.full_epochs:
            logger.warning(
                "early pruning ranks the examples after the first epoch and prunes from the second on: a run of "
                "%g epoch(s) (--num_train_epochs, or what --max_steps covers) trains every example and saves nothing",
                self.num_epochs,
            )

    def plan_epoch(self, stored_losses: torch.Tensor, generator: torch.Generator, epoch: int,
                   labels: torch.Tensor | None = None) -> Selection | None:
        """``labels``: each example's stored class label (-1 where none), which ``by="class_budget"`` needs."""
        if self.kept is None:
            if not bool(torch.isfinite(stored_losses).any()):
                return None
            self.kept = self._choose(stored_losses, generator, labels)
        if epoch >= self.anneal_delta * self.num_epochs:
            return None  # annealing: no plan trains every row loaded
        return Selection(self.kept)

    def _choose(self, stored_losses: torch.Tensor, generator: torch.Generator,
                labels: torch.Tensor | None) -> torch.Tensor:
        self._warn_if_ranked_at_chance(stored_losses)
        count = keep_count(self.keep, stored_losses.numel())
        if self.by == "class_budget":
            if labels is None:
                raise ValueError("by='class_budget' budgets the kept share by class: plan_epoch needs labels=, each "
                                 "example's class label (-1 where none is known)")
            return class_budget_choice(stored_losses, labels, count, generator)
        if self.by == "random":
            order = torch.randperm(stored_losses.numel(), generator=generator)
        elif self.by == "coverage":
            return coverage_choice(stored_losses, count, generator)
        else:
            ranked = torch.nan_to_num(stored_losses.float(), nan=float("inf"))
            order = torch.argsort(ranked, descending=True, stable=True)
        return torch.sort(order[:count]).values

    def _warn_if_ranked_at_chance(self, stored_losses: torch.Tensor) -> None:
        finite = stored_losses[torch.isfinite(stored_losses)]
        if self.chance_loss is None or self.by == "random" or finite.numel() == 0:
            return
        mean = float(finite.float().mean())
        if mean >= AT_CHANCE * self.chance_loss:
            logger.warning(
                "early pruning ranks the examples by first-epoch losses that average %.3g, near chance's %.3g "
                "(ln of the label count): the model barely learned in its first epoch, so the ranking is close to "
                "a random choice. Give it more epochs on everything first (--sb_warmup_epochs), a higher learning "
                "rate, or compare with --sb_strategy early_random", mean, self.chance_loss,
            )

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        # An epoch not planned before loading (the first, or one under --sb_interrupt) trains every row it loads.
        return Selection(torch.arange(losses.numel()))

    def expected_keep_fraction(self) -> float:
        if not self.num_epochs:
            return 1.0
        full = min(self.full_epochs, self.num_epochs)
        # Epoch e prunes when full <= e < anneal_delta x num_epochs.
        end = self.num_epochs if self.anneal_delta == 1.0 else min(math.ceil(self.anneal_delta * self.num_epochs),
                                                                      self.num_epochs)
        pruned = max(end - full, 0.0)
        return (self.num_epochs - pruned * (1.0 - self.keep)) / self.num_epochs

    def state_dict(self) -> dict:
        return {"kept": self.kept}

    def load_state_dict(self, state: dict) -> None:
        self.kept = state["kept"]
