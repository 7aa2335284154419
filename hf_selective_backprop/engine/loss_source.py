"""`LossSource`: where a selection batch's per-example losses come from, and where every loss seen is kept."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator

from ..selectors import Selector
from . import distributed, streams, transfer
from .accounting import SelectionStats
from .batch_rows import batch_length, take_rows
from .reference import IrreducibleLosses, ReferencePass
from .scoring import SelectionScorer, naming_examples
from .store import LabelStore, LossStore

if TYPE_CHECKING:
    from .epoch_plan import PlannedSampler
    from .epoch_planner import EpochPlanner


class LossSource:
    """The per-example loss store (the same on every rank), the class labels of a strategy that budgets by class,
    the irreducible losses of 'rholoss', and the two ways a batch gets losses: a selection forward (which feeds the
    run's example record) or, in a stale epoch read without a plan, the store. It reads the epoch from
    ``planner`` (what is stale, which epoch a stored loss belongs to) and changes nothing there.

    ``forwards_in_lockstep``: whether every rank must run each selection forward together (sharded weights).
    """

    def __init__(self, args, selector: Selector, scorer: SelectionScorer, accelerator: Accelerator,
                 stats: SelectionStats, planner: EpochPlanner, forwards_in_lockstep: bool):
        self.args, self.selector, self.scorer, self.accelerator = args, selector, scorer, accelerator
        self.stats, self.planner, self.forwards_in_lockstep = stats, planner, forwards_in_lockstep
        self.index_column = args.sb_index_column
        #: Whether training forwards refresh the store (Stale-SB, or a strategy that plans from it).
        self.records_training_losses = args.sb_staleness > 1 or selector.uses_stored_losses
        self.store = LossStore()
        #: Each example's class label, for a strategy that budgets by class (``uses_stored_labels``); else None.
        self.labels: LabelStore | None = LabelStore() if selector.uses_stored_labels else None
        #: Irreducible loss per example id ('rholoss'): given before training (use_irreducible) or restored.
        self.irreducible: IrreducibleLosses | None = None
        self.stream = True  # no sampler: ids size the store as they arrive, and are checked for it
        #: The run's example record (`record.keeper.RecordKeeper`), fed every selection forward's losses.
        self.record = None
        #: The stall guard's count of right answers (`stall_guard.AnswerTally`), fed every selection forward's margins.
        self.answers = None
        #: What the latest selection forward raised on this rank, until a gather carries it to every rank.
        self._failure: ValueError | None = None

    def attach(self, sampler: PlannedSampler | None) -> None:
        """The training loader's sampler (None: a stream, whose ids size the store as they arrive).

        The store (where it is kept) and the labels are sized once for the largest of its ids: grown batch by
        batch they would be reallocated each time a larger id shows up (~2.7x their final size at peak,
        docs/reliability.md)."""
        self.stream = sampler is None
        ids = sampler.ids_by_position if sampler is not None else None
        if self.records_training_losses and ids is not None and len(ids) and len(self.store) == 0:
            self.store = LossStore(int(ids.max()) + 1)
        if self.labels is not None and ids is not None and len(ids) and len(self.labels) == 0:
            self.labels = LabelStore(int(ids.max()) + 1)

    def use_irreducible(self, scored: ReferencePass | None) -> None:
        """The irreducible losses 'rholoss' subtracts, and what scoring them cost (None when resuming: the
        checkpoint holds both)."""
        if scored is not None:
            self.irreducible = scored.table
            self.stats.reference_forwards, self.stats.reference_seconds = scored.forwards, scored.seconds

    def ranked_losses(self, ids: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """What the strategy ranks: the losses, or for 'rholoss' the reducible losses (minus irreducible ones)."""
        if not self.selector.uses_reference_losses:
            return losses
        return self.irreducible.reducible(ids.cpu(), losses.cpu())

    def take_failure(self) -> ValueError | None:
        """The latest selection forward's failure on this rank, handed to the gather that carries it."""
        failure, self._failure = self._failure, None
        return failure

    def losses_for(
        self, batch: dict, model: torch.nn.Module, host_ids: torch.Tensor | None = None, loaded: dict | None = None
    ) -> torch.Tensor:
        """Per-example losses of a selection batch: a selection forward (on the device, or on the host when
        the store recorded them), or stored ones (on the host). ``host_ids``: the batch's ids on the host,
        if already copied there; ``loaded``: the selection batch as loaded, of which ``batch`` may hold only
        some rows (a rank with no row to score runs its lockstep forward on one of them).

        Stored losses are read here only in a stale epoch that could not be planned before loading
        (``sb_interrupt``, or an ``sb_start``/``sb_end`` boundary inside it).
        """
        size = batch_length(batch)
        if not self.selector.needs_losses:
            return torch.zeros(size)
        ids = batch.get(self.index_column)  # None for a stream without ids (plain SB only)
        loaded = batch if loaded is None else loaded
        planner = self.planner
        if not planner.is_stale_epoch(planner.epoch) or planner.epoch_plan is not None:
            return self._score(batch, ids, model, loaded)
        if host_ids is None:
            (host_ids,) = transfer.to_host(ids)
        losses, _ = self.store.lookup(host_ids)
        unknown = torch.isnan(losses)
        self.stats.stale_lookups += size - int(unknown.sum())
        # Examples never scored (e.g. new ids) still need one forward to be ranked. One all-reduce decides whether
        # any rank has some: a rank without any then joins the ranks that score them, in the store's gather and
        # (sharded weights) in the forward; when no rank has any, no rank gathers.
        if distributed.all_true(self.accelerator, not bool(unknown.any())):
            return losses
        rows = transfer.to_device(unknown.nonzero().squeeze(1), ids.device)
        fresh = self._score(take_rows(batch, rows), ids[rows], model, loaded)
        losses[unknown] = transfer.to_host(fresh)[0]
        return losses

    def _score(self, batch: dict, ids: torch.Tensor | None, model: torch.nn.Module, loaded: dict) -> torch.Tensor:
        """Losses of ``batch`` by a selection forward. A rank with no rows (another rank scores some) joins
        the store's collective, and runs a forward on one row of ``loaded`` when the weights are sharded; its
        losses are dropped.

        A ValueError of the per-example loss (a class label out of range, on this rank's rows only) is carried
        by the next gather of losses, so that every rank raises it (`distributed.gather_pairs`)."""
        size = batch_length(batch)
        margins = None
        if size > 0:
            with self.stats.timer("selection_forward_seconds"):
                try:
                    inputs = {k: v for k, v in batch.items() if k != self.index_column}
                    if self.record is not None or self.answers is not None:
                        losses, margins = self.scorer(model, inputs, with_margins=True)
                    else:
                        losses = self.scorer(model, inputs)
                except ValueError as error:
                    failure = naming_examples(error, ids, self.index_column)
                    self._failure, losses = failure, torch.full((size,), float("nan"))
        else:
            losses = torch.zeros(0)
            if self.forwards_in_lockstep:
                with self.stats.timer("selection_forward_seconds"):
                    self.scorer(model, {k: v[:1] for k, v in loaded.items() if k != self.index_column})
                self.stats.lockstep_forwards += 1
        self.stats.selection_forwards += size
        if self.answers is not None and margins is not None:
            self.answers.add(margins, batch[self.scorer.label_name])
        if self.record is not None and size > 0:
            self.record.scored(ids, losses, margins, self.planner.epoch)
        if self.records_training_losses:
            losses = self.observe(ids, losses)  # copied to the host with the ids, once
        return losses

    def observe(self, ids: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Store losses of every rank's examples, so each rank holds the same store (a collective); returns
        this rank's ``losses`` on the host. ``labels``: the rows' class labels, stored too where the strategy
        budgets by class (in the same copy and gather as the losses)."""
        failure = self.take_failure()
        if labels is not None and self.labels is not None:
            all_ids, all_losses, all_labels, mine = distributed.gather_labelled(
                self.accelerator, ids, losses.detach(), labels.detach(), failure)
            self.labels.update(all_ids, all_labels)
        else:
            all_ids, all_losses, mine = distributed.gather_pairs(self.accelerator, ids, losses.detach(), failure)
        if self.stream:
            streams.check_id_bound(all_ids, self.stats.examples_loaded, self.index_column)
        self.store.update(all_ids, all_losses, self.planner.epoch)
        return all_losses[mine]

    def state_dict(self) -> dict:
        """The store and labels, and the irreducible losses: scored once before training ('rholoss'), a resumed
        run must not score them again."""
        return {
            "store": self.store.state_dict(),
            "labels": None if self.labels is None else self.labels.state_dict(),
            "irreducible": None if self.irreducible is None else self.irreducible.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
        if self.labels is not None and state.get("labels") is not None:
            self.labels.load_state_dict(state["labels"])
        if state.get("irreducible") is not None:
            self.irreducible = IrreducibleLosses.from_state_dict(state["irreducible"])
