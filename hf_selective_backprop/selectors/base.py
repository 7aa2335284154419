"""What every selection strategy takes and returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Selection:
    """Rows of one selection batch to train on.

    ``indices`` may repeat (sampling with replacement); ``weights`` multiply each selected
    row's loss (None means 1 for all).
    """

    indices: torch.Tensor
    weights: torch.Tensor | None = None


class Selector:
    """Per-example losses in, the rows to backpropagate out.

    A strategy decides at one of two points of an epoch:

    - *after scoring* (``_select``, every strategy): a loaded selection batch's per-example losses
      in, the rows to train out. Subclasses implement ``_select`` on finite losses only: NaN/inf
      losses never reach a strategy (they would poison percentiles and sums) and are never selected.
    - *before loading* (``plan_epoch``, optional): at the start of an epoch, from the examples'
      stored losses alone, which examples to load and train at all. Examples it leaves out cost no
      data loading, augmentation, forward or backward.

    State that must survive a checkpoint goes in ``state_dict``/``load_state_dict``.
    """

    #: False for strategies that ignore losses, so the trainer can skip the selection forward.
    needs_losses: bool = True
    #: True for strategies whose selections carry loss weights.
    produces_weights: bool = False
    #: True for strategies that read each example's latest training-forward loss (``plan_epoch``'s
    #: ``stored_losses``), so the trainer records it even without Stale-SB.
    uses_stored_losses: bool = False
    #: True for strategies that also read each example's class label (class budgets): the trainer then stores the
    #: label of every example it trains beside its loss, and ``plan_epoch`` gets them as ``labels=`` (int64, -1
    #: where none is known). Only one-class-per-example labels are stored; other labels are refused.
    uses_stored_labels: bool = False
    #: True for strategies that rank reducible losses (loss minus the example's irreducible loss from a
    #: reference model): the engine then passes reducible losses wherever losses are passed.
    uses_reference_losses: bool = False

    def select(
        self,
        losses: torch.Tensor,
        generator: torch.Generator,
        population: torch.Tensor | None = None,
    ) -> Selection:
        """Select rows given per-example ``losses`` (CPU, float).

        ``population`` is the set of losses that updates any loss history (e.g. losses gathered
        from all processes); it defaults to ``losses``.
        """
        losses = losses.detach().reshape(-1).float().cpu()
        finite = torch.isfinite(losses)
        if population is None:
            population = losses[finite]
        else:
            population = population.detach().reshape(-1).float().cpu()
            population = population[torch.isfinite(population)]
        if bool(finite.all()):
            return self._select(losses, generator, population)
        rows = finite.nonzero().squeeze(1)
        inner = self._select(losses[rows], generator, population)
        return Selection(rows[inner.indices], inner.weights)

    def _select(self, losses: torch.Tensor, generator: torch.Generator, population: torch.Tensor) -> Selection:
        raise NotImplementedError

    def plan_epoch(self, stored_losses: torch.Tensor, generator: torch.Generator, epoch: int) -> Selection | None:
        """Decide epoch ``epoch`` before loading it, or return None (the default) to decide after scoring.

        ``stored_losses[i]`` is example i's latest stored loss (NaN where none is known). The
        returned ``indices`` are the examples to train this epoch (an index twice trains it twice),
        ``weights`` their loss weights. Every process calls this with the same arguments and
        generator state, so the decision must depend on nothing else.
        """
        return None

    def stream_epoch_rule(self, stored_losses: torch.Tensor, epoch: int) -> float | None:
        """For data without positions (a stream), where ``plan_epoch`` cannot run: what `plan_rows` needs of
        every stored loss at the start of epoch ``epoch`` (a float, saved with checkpoints), or None (the
        default) to decide after scoring. Every process holds the same ``stored_losses``."""
        return None

    def plan_rows(
        self, stored_losses: torch.Tensor, generator: torch.Generator, rule: float, progress: float
    ) -> Selection | None:
        """``plan_epoch``'s decision for the rows of one loaded batch of a stream, from their stored losses
        (NaN where none) and the epoch's ``rule``; ``progress`` is the run's share done. None: decide these
        rows after scoring.

        On several processes every rank must answer None for a batch, or none may: ranks that score a batch
        gather its losses, and a rank that planned it would not join them. Decide None from ``rule`` and
        ``progress``, which every rank shares, not from the rows' losses, which differ between ranks. The engine
        checks the ranks' answers together (one small gather per batch) and stops every rank, naming the ranks
        that answered None, when they differ."""
        return None

    def expected_keep_fraction(self) -> float:
        """Expected fraction of a selection batch that is trained on, for sizing the LR schedule."""
        raise NotImplementedError

    def fit_run(self, num_epochs: float) -> None:
        """The epochs a budget run (--sb_budget) is expected to read, in place of ``num_train_epochs``: a strategy
        that decides by the run's epochs counts in these. Called before training and on resume; by default
        nothing depends on them."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Stateless by default."""


def bernoulli_keep(probabilities: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Indices kept by one independent coin flip per row."""
    draws = torch.rand(probabilities.shape, generator=generator)
    return (draws < probabilities).nonzero().squeeze(1)
