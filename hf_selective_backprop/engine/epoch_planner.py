"""`EpochPlanner`: which rows each epoch loads and trains, decided at its start, and where its reading stands."""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from transformers.trainer_utils import has_length

from ..selectors import Selector
from . import distributed
from .accounting import SelectionStats
from .epoch_plan import EpochPlan, PlannedSampler, stale_plan
from .loss_source import LossSource


class EpochPlanner:
    """The epoch, its plan (`EpochPlan`: made on the main process from the stored losses, the same on every rank),
    a stream's epoch rule, and the epoch's read position: selection batches read and steps taken, and where a
    resumed epoch starts. It tells the training loader's sampler what to load and what to skip.

    ``selection_batch_size``: the rows of one loaded selection batch, per process.
    """

    def __init__(self, args, selector: Selector, accelerator: Accelerator, stats: SelectionStats,
                 selection_batch_size: int):
        self.args, self.selector, self.accelerator, self.stats = args, selector, accelerator, stats
        self.selection_batch_size = selection_batch_size
        self.plans_before_loading = args.sb_staleness > 1 or type(selector).plan_epoch is not Selector.plan_epoch
        self.sampler: PlannedSampler | None = None
        self.dataloader = None
        self.epoch = 0
        self.epoch_started = False  # begin ran for self.epoch (its plan, if any, is made)
        self.epoch_plan: EpochPlan | None = None
        #: A stream's epoch, which cannot be planned: what the strategy's plan_rows needs (InfoBatch: a mean).
        self.stream_rule: float | None = None
        self.resumed_stream_rule: float | None = None  # the resumed epoch's, from the checkpoint
        self.resumed_position: tuple[int, EpochPlan | None, int] | None = None  # epoch, plan, rows to skip
        self.batches_read = 0  # selection batches of the epoch read by this process (skipped ones included)
        self.batches_in_epoch = 1
        self.unread_skips = 0  # a resumed stream's batches read before the checkpoint, read again unused
        self.loader_seeded_before_checkpoint = False  # see next_read()
        self.steps_in_epoch = 0
        self.epoch_without_step = False

    def is_stale_epoch(self, epoch: int) -> bool:
        return self.args.sb_staleness > 1 and (epoch - self.args.sb_warmup_epochs) % self.args.sb_staleness != 0

    def _whole_epoch_selects(self, epoch: int, num_epochs: float, epoch_based: bool) -> bool:
        """True when every step of ``epoch`` selects, so its decisions can all be made up front."""
        args = self.args
        if epoch < args.sb_warmup_epochs or args.sb_interrupt:
            return False
        if args.sb_start == 0.0 and args.sb_end == 1.0:
            return True
        return epoch_based and args.sb_start <= epoch / num_epochs and (epoch + 1) / num_epochs <= args.sb_end

    def begin(self, epoch: int, num_epochs: float, epoch_based: bool, losses: LossSource) -> None:
        """Decide, before loading, what ``epoch`` loads, from the stored ``losses`` (a collective: call on every
        process)."""
        self.epoch = epoch
        self.epoch_started = True
        skip_rows = 0
        resumed = self.resumed_position is not None and self.resumed_position[0] == epoch
        if resumed:
            _, self.epoch_plan, skip_rows = self.resumed_position
            self.loader_seeded_before_checkpoint = skip_rows > 0
        elif self.sampler is None or self.sampler.ids_by_position is None:
            self.epoch_plan = None
        elif not self._whole_epoch_selects(epoch, num_epochs, epoch_based):
            self.epoch_plan = None
        else:
            made = self._make_plan(epoch, losses) if self.accelerator.is_main_process else None
            self.epoch_plan = self._broadcast(made)
        # A stream cannot be planned: its batches are decided from their stored losses by a rule made from the
        # store at the epoch's start (a resumed epoch's comes from the checkpoint: the store has changed since).
        if resumed:
            self.stream_rule = self.resumed_stream_rule
        elif self.sampler is None and not self.is_stale_epoch(epoch):
            self.stream_rule = self.selector.stream_epoch_rule(losses.store.losses, epoch)
        else:
            self.stream_rule = None
        self.resumed_position = self.resumed_stream_rule = None
        rows_per_batch = self.selection_batch_size * self.accelerator.num_processes
        self.batches_read = skip_rows // rows_per_batch
        if self.sampler is not None:
            self.sampler.epoch_plan, self.sampler.skip = self.epoch_plan, skip_rows
        else:
            self.unread_skips = self.batches_read  # a stream cannot skip rows without reading them
        if self.dataloader is not None and has_length(self.dataloader):
            self.batches_in_epoch = max(len(self.dataloader) + self.batches_read, 1)
        else:
            self.batches_in_epoch = sys.maxsize  # a stream: an epoch of unknown length

    def _make_plan(self, epoch: int, losses: LossSource) -> EpochPlan | None:
        ids = self.sampler.ids_by_position
        stored = losses.ranked_losses(ids, losses.store.lookup(ids)[0])
        # Seeded by the epoch alone: a resumed or re-launched run draws the same plan.
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_033 + epoch)
        with self.stats.timer("selection_overhead_seconds"):
            if self.is_stale_epoch(epoch):
                by_position, looked_up = stale_plan(self.selector, stored, generator, self.selection_batch_size)
                self.stats.stale_lookups += looked_up
            else:
                if losses.labels is not None:
                    selection = self.selector.plan_epoch(stored, generator, epoch, labels=losses.labels.lookup(ids))
                else:
                    selection = self.selector.plan_epoch(stored, generator, epoch)
                if selection is None:
                    return None
                by_position = EpochPlan.from_selection(selection, len(ids))
        decided = int(by_position.copies.sum())
        self.stats.considered += int((~by_position.scored).sum())
        self.stats.kept += decided
        # Every example decided here has been seen by the epoch, loaded or not.
        self.stats.examples_seen += len(ids) - int(by_position.scored.sum())
        return by_id(by_position, ids)

    def _broadcast(self, plan: EpochPlan | None) -> EpochPlan | None:
        if self.accelerator.num_processes == 1:
            return plan
        # The main process made the plan alone, and a stale epoch's plan runs the strategy's rule (and
        # its loss history) over every stored loss: with a global history, every rank continues from there.
        shared = self.args.sb_history_scope == "global"
        state = self.selector.state_dict() if shared and self.accelerator.is_main_process else None
        plan, state = distributed.broadcast_object(self.accelerator, (plan, state))
        if state is not None and not self.accelerator.is_main_process:
            self.selector.load_state_dict(state)
        return plan

    def next_read(self) -> tuple[int, bool]:
        """Before each read: the batches of a resumed stream to read again unused first, and whether the read
        starts the DataLoader's iterator for an epoch the checkpoint's run had started already.

        That read draws a base seed from the global RNG. The uninterrupted run drew it before the checkpoint's RNG
        state was saved; drawn again, it would shift every later draw (dropout) of the resumed run."""
        skips, self.unread_skips = self.unread_skips, 0
        seeded, self.loader_seeded_before_checkpoint = self.loader_seeded_before_checkpoint, False
        return skips, seeded

    def end(self) -> None:
        self.epoch_without_step = self.steps_in_epoch == 0
        self.epoch += 1
        self.epoch_started = False
        self.epoch_plan = None
        self.batches_read = 0
        self.steps_in_epoch = 0

    def epochs_read(self) -> float:
        return self.epoch + self.batches_read / self.batches_in_epoch

    def state_dict(self) -> dict:
        """The epoch and the position in it: selection batches read by each of ``world_size`` processes, of
        ``rows_per_batch`` rows each, and the epoch's plan or stream rule."""
        return {
            "epoch": self.epoch,
            "consumed": self.batches_read,
            "rows_per_batch": self.selection_batch_size,
            # Made at the epoch's start from the store of then: once the epoch has begun it cannot be redrawn.
            "epoch_started": self.epoch_started,
            "plan": None if self.epoch_plan is None else self.epoch_plan.state_dict(),
            # A stream's epoch rule (InfoBatch's mean), made from the store at the epoch's start, likewise.
            "stream_rule": self.stream_rule,
            "world_size": self.accelerator.num_processes,
        }

    def load_state_dict(self, state: dict, ignore_data_skip: bool = False) -> None:
        """The saved epoch; a started one resumes (at `begin`) with its plan and rule, skipping, unloaded, the rows
        every process together had read (none with ``ignore_data_skip``)."""
        self.epoch = state["epoch"]
        plan = None if state["plan"] is None else EpochPlan.from_state_dict(state["plan"])
        read = state["consumed"] * state["world_size"] * state["rows_per_batch"]
        if state["epoch_started"]:
            self.resumed_position = (state["epoch"], plan, 0 if ignore_data_skip else read)
            self.resumed_stream_rule = state.get("stream_rule")


def by_id(plan: EpochPlan, ids: torch.Tensor) -> EpochPlan:
    """``plan``, made by position over the dataset's rows, keyed by their ``ids`` instead."""
    size = int(ids.max()) + 1 if len(ids) else 0
    copies = torch.zeros(size, dtype=torch.int32).index_copy_(0, ids, plan.copies)
    scored = torch.zeros(size, dtype=torch.bool).index_copy_(0, ids, plan.scored)
    weights = None
    if plan.weights is not None:
        weights = torch.ones(size, dtype=torch.float32).index_copy_(0, ids, plan.weights)
    return EpochPlan(copies, scored, weights)
