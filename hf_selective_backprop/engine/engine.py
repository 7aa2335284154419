"""`SelectionEngine`: everything selection holds between steps, and the one place that changes it.

Data flows one way through it (docs/architecture.md):

    begin_epoch   -> plan: examples decided before loading (uniform, Stale-SB's stale epochs, ...)
    add_batch     -> loaded selection batch: planned rows straight to the queue, the others
                     scored (selection forward, or a stored loss) and selected
    next_step     -> exactly gradient_accumulation_steps micro-batches of exactly the batch size
    observe       -> training-forward losses refresh the per-example store
    end_epoch

Its state goes into checkpoints through ``state_dict`` / ``load_state_dict`` (files: `state_files`).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from functools import partial

import torch
from accelerate import Accelerator
from transformers.trainer_utils import has_length

from ..selectors import Selector
from . import distributed, streams, transfer
from .accounting import SelectionStats, merged_stats
from .budget import PHI_MEASURING, BudgetPlan
from .data_state import DataState
from .epoch_plan import EpochPlan, PlannedSampler, stale_plan
from .phi_meter import PhiMeasurement, PhiMeter
from .queue import BatchQueue
from .reference import IrreducibleLosses, ReferencePass
from .schedule import in_selection_window, is_interrupt_step
from .scoring import SelectionScorer, naming_examples
from .store import LabelStore, LossStore

WEIGHT_KEY = "sb_weight"

logger = logging.getLogger(__name__)


class SelectionEngine:
    """Strategy, loss history (inside the strategy), store, queue, generator and counters of one process.

    ``args`` is the `SelectiveBackpropConfig`; ``batch_size`` the training micro-batch size and
    ``selection_batch_size`` the rows of one loaded selection batch, per process; ``padding`` the
    `BatchQueue` pad values and side for variable-length (text) rows. ``forwards_in_lockstep``: whether
    every rank must run each selection forward together (weights sharded by DeepSpeed ZeRO-3 or FSDP);
    by default read from ``accelerator``.
    """

    def __init__(
        self,
        args,
        selector: Selector,
        scorer: SelectionScorer,
        accelerator: Accelerator,
        batch_size: int,
        selection_batch_size: int,
        padding: dict | None = None,
        forwards_in_lockstep: bool | None = None,
    ):
        self.args, self.selector, self.scorer, self.accelerator = args, selector, scorer, accelerator
        self.batch_size, self.selection_batch_size = batch_size, selection_batch_size
        self.index_column = args.sb_index_column
        if forwards_in_lockstep is None:
            forwards_in_lockstep = distributed.shards_weights(accelerator)
        self.forwards_in_lockstep = forwards_in_lockstep
        self.queue = BatchQueue(**(padding or {}))
        self.store = LossStore()
        #: Each example's class label, for a strategy that budgets by class (``uses_stored_labels``); else None.
        self.labels: LabelStore | None = LabelStore() if selector.uses_stored_labels else None
        #: Irreducible loss per example id ('rholoss'): given before training (use_irreducible) or restored.
        self.irreducible: IrreducibleLosses | None = None
        self.stats = SelectionStats()
        if args.sb_sync_timers and accelerator.device.type != "cpu":
            self.stats.synchronize = partial(torch.accelerator.synchronize, accelerator.device)
        self.generator = torch.Generator().manual_seed(args.seed + 1_000_003 * args.process_index)
        self.sampler: PlannedSampler | None = None
        self.dataloader = None
        self.data_state = DataState({})
        self.run: dict | None = None  # what the run is (run_signature.describe): saved with checkpoints
        self.saved_model_buffers: dict | None = None  # this process's, from the resumed checkpoint
        self.epoch_plan: EpochPlan | None = None
        #: A stream's epoch, which cannot be planned: what the strategy's plan_rows needs (InfoBatch: a mean).
        self.stream_rule: float | None = None
        self.resumed_stream_rule: float | None = None  # the resumed epoch's, from the checkpoint
        self.progress_now = 0.0  # the run's share done, as of the latest selection_on
        self.epoch = 0
        self.batches_read = 0  # selection batches of the epoch read by this process (skipped ones included)
        self.batches_in_epoch = 1
        self.resumed_position: tuple[int, EpochPlan | None, int] | None = None  # epoch, plan, rows to skip
        self.epoch_started = False  # begin_epoch ran for self.epoch (its plan, if any, is made)
        self.unread_skips = 0
        self.loader_seeded_before_checkpoint = False  # see read()
        self.epoch_based = True  # epoch-based runs end with their data, others by steps (set_run_length)
        self.budget: BudgetPlan | None = None  # a budget run's plan (--sb_budget): it ends when the budget is spent
        self.budget_spent = 0.0  # cost spent, summed over processes (BudgetPlan.spent), as of the latest step
        self.budget_done = False
        self.replan: Callable[[float], BudgetPlan] | None = None  # the budget's plan for a measured phi
        self.phi_meter: PhiMeter | None = None  # times phi on the first steps of a budget run given no phi
        self._budget_totals: dict | None = None  # the counts the latest budget_spent priced, over all processes
        self.steps_in_epoch = 0
        self.epoch_without_step = False
        self.inputs_checked = False
        self._epoch_scored = self._epoch_nonfinite = 0
        #: What the latest selection forward raised on this rank, until a gather carries it to every rank.
        self._failure: ValueError | None = None
        #: Non-finite training-forward losses since the last optimizer step, counted on the device.
        self._training_nonfinite: torch.Tensor | None = None
        #: The run's example record (`record.keeper.RecordKeeper`), fed every selection forward's losses.
        self.record = None

    # ---- set-up ------------------------------------------------------------------------------

    @property
    def records_training_losses(self) -> bool:
        """Whether training forwards refresh the store (Stale-SB, or a strategy that plans from it)."""
        return self.args.sb_staleness > 1 or self.selector.uses_stored_losses

    @property
    def plans_before_loading(self) -> bool:
        return self.args.sb_staleness > 1 or type(self.selector).plan_epoch is not Selector.plan_epoch

    def attach(self, dataloader, sampler: PlannedSampler | None, data_state: DataState, run: dict) -> None:
        """The training loader (its length per epoch), its sampler (the plan it follows), the random state of
        its dataset and collator, and the run's signature."""
        self.dataloader, self.sampler, self.data_state, self.run = dataloader, sampler, data_state, run
        ids = sampler.ids_by_position if sampler is not None else None
        if self.records_training_losses and ids is not None and len(ids) and len(self.store) == 0:
            # Sized once for the largest id: grown batch by batch it would be reallocated each time a
            # larger id shows up (~2.7x its final size at peak, docs/reliability.md).
            self.store = LossStore(int(ids.max()) + 1)
        if self.labels is not None and ids is not None and len(ids) and len(self.labels) == 0:
            self.labels = LabelStore(int(ids.max()) + 1)

    def set_run_length(self, epoch_based: bool, budget: BudgetPlan | None = None,
                       replan: Callable[[float], BudgetPlan] | None = None) -> None:
        """Whether the run ends when its data does (epoch-based), when ``budget`` is spent, or after a number of
        steps. ``replan`` makes the budget's plan from a measured phi (a plan whose phi is being measured)."""
        self.epoch_based = epoch_based and budget is None
        self.replan = replan
        if budget is not None:
            self._adopt_budget(budget)
            self.budget_spent, self.budget_done = budget.before_training, False

    def _adopt_budget(self, budget: BudgetPlan) -> None:
        self.budget = budget
        self.phi_meter = None
        if budget.phi_source == PHI_MEASURING:
            device_synchronize = None
            if self.accelerator.device.type != "cpu":
                device_synchronize = partial(torch.accelerator.synchronize, self.accelerator.device)
            self.phi_meter = PhiMeter(self.stats, device_synchronize)
        if budget.epochs is not None:
            self.selector.fit_run(budget.epochs)

    @property
    def follows_progress(self) -> bool:
        """Whether the run's end and its schedule follow its progress (data read, or budget spent), not its steps
        alone: an epoch's step count under selection is known only afterwards."""
        return self.epoch_based or self.budget is not None

    def use_irreducible(self, scored: ReferencePass | None) -> None:
        """The irreducible losses 'rholoss' subtracts, and what scoring them cost (None when resuming: the
        checkpoint holds both)."""
        if scored is not None:
            self.irreducible = scored.table
            self.stats.reference_forwards, self.stats.reference_seconds = scored.forwards, scored.seconds

    # ---- state -------------------------------------------------------------------------------

    def state_dict(self, model: torch.nn.Module | None = None) -> dict:
        """``{"shared": ..., "rank": ...}``: what every process holds alike (the strategy, store, epoch, plan and
        position, the run's signature; saved once) and what this process owns (generator, queue, counters,
        strategy, data pipeline state and, with several processes, ``model``'s buffers)."""
        shared = {
            "selector": self.selector.state_dict(),
            "store": self.store.state_dict(),
            "labels": None if self.labels is None else self.labels.state_dict(),
            "epoch": self.epoch,
            "consumed": self.batches_read,
            "rows_per_batch": self.selection_batch_size,
            # Made at the epoch's start from the store of then: once the epoch has begun it cannot be redrawn.
            "epoch_started": self.epoch_started,
            "plan": None if self.epoch_plan is None else self.epoch_plan.state_dict(),
            # A stream's epoch rule (InfoBatch's mean), made from the store at the epoch's start, likewise.
            "stream_rule": self.stream_rule,
            "world_size": self.accelerator.num_processes,
            "run": self.run,
            # Scored once before training ('rholoss'): a resumed run must not score it again.
            "irreducible": None if self.irreducible is None else self.irreducible.state_dict(),
            # A budget run's plan and what it spent: the resumed run keeps them and ends at the same step.
            "budget": None if self.budget is None else self.budget.state_dict(),
            "budget_spent": self.budget_spent,
            "budget_done": self.budget_done,
        }
        rank = {
            "generator": self.generator.get_state(),
            "queue": self.queue.state_dict(),
            "stats": self.stats.state_dict(),
            # Per rank too: a 'local' history scope (or kath18's running tau) differs between ranks.
            "selector": self.selector.state_dict(),
            "data": self.data_state.state_dict(),
        }
        if model is not None and self.accelerator.num_processes > 1:
            rank["model_buffers"] = model_buffers(model)
        return {"shared": shared, "rank": rank}

    def load_state_dict(self, state: dict, ignore_data_skip: bool = False) -> list[int]:
        """Restore ``{"shared": ..., "ranks": {saved rank: its state}}``; the resumed epoch then skips, unloaded,
        the rows already read (all of them re-read with ``ignore_data_skip``).

        With as many processes as saved, ``ranks`` holds this process's own state. With another number, it
        holds those of saved ranks r, r + world, ... (this rank r takes over their queued rows and counters, and
        continues saved rank r's generator, strategy and data pipeline). Returns the saved ranks taken over.
        """
        shared = state["shared"]
        self.selector.load_state_dict(shared["selector"])
        self.store.load_state_dict(shared["store"])
        if self.labels is not None and shared.get("labels") is not None:
            self.labels.load_state_dict(shared["labels"])
        if shared.get("irreducible") is not None:
            self.irreducible = IrreducibleLosses.from_state_dict(shared["irreducible"])
        self.epoch = shared["epoch"]
        if shared.get("budget") is not None:
            self._adopt_budget(BudgetPlan.from_state_dict(shared["budget"]))
            self.budget_spent, self.budget_done = shared["budget_spent"], shared["budget_done"]
        plan = None if shared["plan"] is None else EpochPlan.from_state_dict(shared["plan"])
        # Rows of the epoch's (planned) order that all processes together had read.
        read = shared["consumed"] * shared["world_size"] * shared["rows_per_batch"]
        if shared["epoch_started"]:
            self.resumed_position = (shared["epoch"], plan, 0 if ignore_data_skip else read)
            self.resumed_stream_rule = shared.get("stream_rule")
        ranks = state["ranks"]
        self.queue.clear()
        for saved in ranks.values():
            # Saved rows are on the CPU; new rows arrive on the device, and a popped batch may join both.
            self.queue.push({key: value.to(self.args.device) for key, value in saved["queue"]["rows"].items()})
        own = ranks.get(self.args.process_index)
        if own is not None:
            self.generator.set_state(own["generator"])
            self.selector.load_state_dict(own["selector"])
            self.data_state.load_state_dict(own.get("data"))
            self.saved_model_buffers = own.get("model_buffers")
        if shared["world_size"] == self.accelerator.num_processes:
            self.stats.load_state_dict(own["stats"])
        elif ranks:
            self.stats.load_state_dict(merged_stats([saved["stats"] for saved in ranks.values()]))
        return sorted(ranks)

    def restore_model_buffers(self, model: torch.nn.Module) -> None:
        """Put the buffers this process saved back into ``model`` (the unwrapped model), once after a resume.

        Called after the model is wrapped: wrapping it in DDP copies rank 0's buffers to every rank.
        """
        saved, self.saved_model_buffers = self.saved_model_buffers, None
        if not saved:
            return
        buffers = dict(model.named_buffers())
        with torch.no_grad():
            for name, value in saved.items():
                if name in buffers:
                    buffers[name].copy_(value)

    # ---- epochs ------------------------------------------------------------------------------

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

    def begin_epoch(self, epoch: int, num_epochs: float, epoch_based: bool) -> None:
        """Decide, before loading, what the epoch loads (a collective: call on every process)."""
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
            self.epoch_plan = self._broadcast(self._make_plan(epoch) if self.accelerator.is_main_process else None)
        # A stream cannot be planned: its batches are decided from their stored losses by a rule made from the
        # store at the epoch's start (a resumed epoch's comes from the checkpoint: the store has changed since).
        if resumed:
            self.stream_rule = self.resumed_stream_rule
        elif self.sampler is None and not self.is_stale_epoch(epoch):
            self.stream_rule = self.selector.stream_epoch_rule(self.store.losses, epoch)
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

    def _make_plan(self, epoch: int) -> EpochPlan | None:
        ids = self.sampler.ids_by_position
        stored = self._ranked(ids, self.store.lookup(ids)[0])
        # Seeded by the epoch alone: a resumed or re-launched run draws the same plan.
        generator = torch.Generator().manual_seed(self.args.seed * 1_000_033 + epoch)
        with self.stats.timer("selection_overhead_seconds"):
            if self.is_stale_epoch(epoch):
                by_position, looked_up = stale_plan(self.selector, stored, generator, self.selection_batch_size)
                self.stats.stale_lookups += looked_up
            else:
                if self.labels is not None:
                    selection = self.selector.plan_epoch(stored, generator, epoch, labels=self.labels.lookup(ids))
                else:
                    selection = self.selector.plan_epoch(stored, generator, epoch)
                if selection is None:
                    return None
                by_position = EpochPlan.from_selection(selection, len(ids))
        by_id = self._by_id(by_position, ids)
        decided = int(by_position.copies.sum())
        self.stats.considered += int((~by_position.scored).sum())
        self.stats.kept += decided
        # Every example decided here has been seen by the epoch, loaded or not.
        self.stats.examples_seen += len(ids) - int(by_position.scored.sum())
        return by_id

    def _by_id(self, plan: EpochPlan, ids: torch.Tensor) -> EpochPlan:
        size = int(ids.max()) + 1 if len(ids) else 0
        copies = torch.zeros(size, dtype=torch.int32).index_copy_(0, ids, plan.copies)
        scored = torch.zeros(size, dtype=torch.bool).index_copy_(0, ids, plan.scored)
        weights = None
        if plan.weights is not None:
            weights = torch.ones(size, dtype=torch.float32).index_copy_(0, ids, plan.weights)
        return EpochPlan(copies, scored, weights)

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

    def end_epoch(self) -> None:
        self._fail_if_every_loss_was_nonfinite()
        self.epoch_without_step = self.steps_in_epoch == 0
        self.epoch += 1
        self.epoch_started = False
        self.epoch_plan = None
        self.batches_read = 0
        self.steps_in_epoch = 0
        self._epoch_scored = self._epoch_nonfinite = 0

    def _fail_if_every_loss_was_nonfinite(self) -> None:
        """Stop a run that cannot progress: every loss scored this epoch (on some rank) was NaN/inf.

        Such rows are never kept, so nothing is trained; a step-based run would read epochs forever.
        """
        planned = self.epoch_plan is not None and bool(self.epoch_plan.copies.any())
        stuck = not planned and self._epoch_scored > 0 and self._epoch_nonfinite == self._epoch_scored
        if distributed.all_true(self.accelerator, not stuck):
            return
        raise RuntimeError(
            f"every per-example loss scored in epoch {self.epoch} was NaN or inf (this process: "
            f"{self._epoch_nonfinite} of {self._epoch_scored} non-finite): selection never keeps such "
            f"examples, so training cannot make progress. {NONFINITE_CAUSE}"
        )

    def observe_training_loss(self, loss: torch.Tensor) -> None:
        """Count a training forward's loss if it is NaN or inf, on the device (checked before the step).

        A strategy that decides before loading (InfoBatch, a planned Stale-SB epoch) trains rows no
        selection forward scored, so a model that diverged is first seen here."""
        nonfinite = (~torch.isfinite(loss.detach())).sum()
        if self._training_nonfinite is not None:
            nonfinite = nonfinite + self._training_nonfinite
        self._training_nonfinite = nonfinite

    def fail_if_training_loss_was_nonfinite(self, step: int) -> None:
        """Stop before an optimizer step whose loss (on some rank) was NaN or inf: it would make every weight
        non-finite. Never trained, as a non-finite selection loss never is (a collective)."""
        nonfinite = 0 if self._training_nonfinite is None else int(self._training_nonfinite)  # one wait a step
        self._training_nonfinite = None
        self.stats.nonfinite_losses += nonfinite
        if distributed.all_true(self.accelerator, nonfinite == 0):
            return
        raise RuntimeError(
            f"the training loss of step {step + 1} was NaN or inf (this process: {nonfinite} non-finite "
            f"micro-batch loss(es)); stopped before the optimizer step, which would make the weights non-finite. "
            f"{NONFINITE_CAUSE}"
        )

    def read_all_asked(self) -> bool:
        """True once an epoch-based run has read the share of its last epoch that a fractional
        num_train_epochs asks for (a whole last epoch ends by running out of data instead)."""
        if self.budget is not None:
            return self.budget_done
        unfinished = self.batches_read < self.batches_in_epoch
        return self.epoch_based and unfinished and self.epochs_read() >= self.args.num_train_epochs

    def epochs_read(self) -> float:
        return self.epoch + self.batches_read / self.batches_in_epoch

    def progress(self, global_step: int, max_steps: int) -> float:
        """Fraction of the run done: budget spent (budget runs), data read (epoch-based runs) or optimizer steps."""
        if self.budget is not None:
            return 1.0 if self.budget_done else self.budget.progress(self.budget_spent)
        if self.epoch_based:
            return min(self.epochs_read() / self.args.num_train_epochs, 1.0)
        return min(global_step / max_steps, 1.0)

    def budget_summary(self) -> dict:
        """A budget run's plan and the share of the full run's cost spent so far (empty without a budget)."""
        if self.budget is None:
            return {}
        return {"budget": self.budget.budget, "cost_phi": self.budget.phi, "cost_phi_source": self.budget.phi_source,
                "budget_spent": self.budget_spent / self.budget.full_cost}

    # ---- steps -------------------------------------------------------------------------------

    def selection_on(self, global_step: int, progress: float, max_steps: int) -> bool:
        """Whether the rows read now are selected: after warm-up, inside sb_start/sb_end, not an interrupt."""
        self.progress_now = progress
        if self.epoch < self.args.sb_warmup_epochs or is_interrupt_step(global_step, self.args.sb_interrupt):
            return False
        # The window is a share of the run's progress, like the LR schedule.
        return in_selection_window(int(progress * max_steps), max_steps, self.args.sb_start, self.args.sb_end)

    def ready(self) -> bool:
        """True on every process once each holds a full optimizer step (a collective)."""
        rows_per_step = self.batch_size * self.args.gradient_accumulation_steps
        return distributed.all_true(self.accelerator, len(self.queue) >= rows_per_step)

    def fill_step(self, epoch_iterator, selecting: bool, model: torch.nn.Module) -> str | None:
        """Read and select selection batches until every process holds a full optimizer step (None), or until
        "epoch" (the epoch's data ran out, on some process) or "run" (an epoch-based run read the share of its
        last epoch that a fractional num_train_epochs asks for) ends first. A collective."""
        while not self.ready():
            if self.read_all_asked():  # not one selection batch more than the fraction
                return "run"
            batch = self.read(epoch_iterator)
            if not distributed.all_true(self.accelerator, batch is not None):
                self.end_epoch()
                return "epoch"
            if not self.inputs_checked:
                self.check_inputs(batch, model)
            self.add_batch(batch, selecting, model)
        return None

    def next_step(self, device) -> list[dict]:
        with self.stats.timer("selection_overhead_seconds"):
            micro_batches = [
                {k: transfer.to_device(v, device) for k, v in self.queue.pop(self.batch_size).items()}
                for _ in range(self.args.gradient_accumulation_steps)
            ]
        trained = self.batch_size * self.args.gradient_accumulation_steps
        self.stats.training_forwards += trained
        self.stats.backwards += trained
        self.stats.optimizer_steps += 1
        self.steps_in_epoch += 1
        if self.budget is not None:
            self._count_budget()
        return micro_batches

    def _count_budget(self) -> None:
        """The cost spent up to the step about to run, the same on every process (a collective), and whether
        it ends the run: when half the cost of another such step would reach the budget."""
        stats = self.stats
        totals = distributed.sum_over_processes(self.accelerator, {
            "backwards": stats.backwards, "selection": stats.selection_forwards, "reference": stats.reference_forwards,
        })
        if self.phi_meter is not None:
            measured = self.phi_meter.at_step(self.accelerator, totals["selection"])
            if measured is not None:
                self._price_at(measured)
        spent = self.budget.spent(totals["backwards"], totals["selection"], totals["reference"])
        step_cost, self.budget_spent = spent - self.budget_spent, spent
        self.budget_done = spent + step_cost / 2 >= self.budget.target
        self._budget_totals = totals

    def _price_at(self, measured: PhiMeasurement) -> None:
        """The plan made anew from the measured phi, and what was spent so far priced at it: the schedule
        follows the budget spent, so it moves by what the measurement changed, once."""
        before, measured_plan = self.budget, self.replan(measured.phi)
        # The schedule was built over the steps first planned, and spans the run by its share of the budget
        # spent: a resumed run rebuilds it over the same steps, so it must find them in the plan.
        self._adopt_budget(dataclasses.replace(measured_plan, steps=before.steps))
        previous = self._budget_totals
        self.budget_spent = self.budget.spent(previous["backwards"], previous["selection"], previous["reference"])
        logger.info(
            "--sb_budget: phi measured on optimizer steps %d-%d: %.3f (a selection %.3f ms per scored example, a "
            "training step %.3f ms per trained example; the cost model's %.3f until now): the budget buys about "
            "%d optimizer steps (%d at the cost model's phi)",
            measured.first_step, measured.last_step, measured.phi, measured.selection_ms, measured.training_ms,
            before.phi, measured_plan.steps, before.steps,
        )

    def check_inputs(self, batch: dict, model: torch.nn.Module) -> None:
        """At the run's first batch, one selection forward on one example: a model that cannot take
        --sb_selection_scale / --sb_selection_channels_last inputs fails now, not when the schedule
        (sb_start, warm-up epochs) first turns selection on."""
        self.inputs_checked = True
        needs = streams.id_needs(self.args, self.selector, stream=self.sampler is None)
        if self.index_column not in batch and needs is not None:
            # Without ids the store and the epoch's plan cannot key examples (it used to fail in the store); a
            # stream whose columns are not known before reading it fails here, at its first batch.
            raise ValueError(streams.missing_ids_message(self.index_column, batch, needs))
        check_rows(batch)
        if self.selector.needs_losses:
            self.scorer.check_inputs(model, {k: v[:1] for k, v in batch.items() if k != self.index_column})

    def read(self, epoch_iterator) -> dict | None:
        """The next selection batch, or None at the end of the epoch."""
        if self.loader_seeded_before_checkpoint:
            self.loader_seeded_before_checkpoint = False
            # The epoch's first read starts the DataLoader's iterator, which draws a base seed from the
            # global RNG. The uninterrupted run drew it before the checkpoint's RNG state was saved;
            # drawn again, it would shift every later draw (dropout) of the resumed run.
            with torch.random.fork_rng(devices=[]):
                return self._read(epoch_iterator)
        return self._read(epoch_iterator)

    def _read(self, epoch_iterator) -> dict | None:
        with self.stats.timer("data_seconds"):
            for _ in range(self.unread_skips):
                self.data_state.next(epoch_iterator)
            self.unread_skips = 0
            return self.data_state.next(epoch_iterator)

    def add_batch(self, batch: dict, selecting: bool, model: torch.nn.Module) -> None:
        """Queue a loaded selection batch's rows to train: all, the planned ones, or those selected.

        The host waits for the device once per selection batch on one process: for the batch's ids in a
        planned epoch, else for its losses (docs/gpu.md counts the synchronisations).
        """
        self.batches_read += 1
        self.stats.examples_loaded += _batch_length(batch)
        host_ids = None
        if selecting and self.epoch_plan is not None:
            (host_ids,) = transfer.to_host(batch[self.index_column])
            decided = self.epoch_plan.is_decided(host_ids)
            if bool(decided.any()):
                self._push(self._planned_rows(batch, host_ids, decided))  # counted as seen when planned
            done = bool(decided.all())
            if bool(self.epoch_plan.scored.any()):
                # Scoring rows without a finite stored loss runs collectives, and ranks read different
                # numbers of them: a rank with none joins them with no rows, unless no rank has any.
                done = distributed.all_true(self.accelerator, done)
            if done:
                return
            undecided = (~decided).nonzero().squeeze(1)
            loaded = batch
            batch, host_ids = _rows(batch, transfer.to_device(undecided, _batch_device(batch))), host_ids[undecided]
        else:
            loaded = batch
        if selecting and self.stream_rule is not None and self._decide_from_store(batch):
            return
        self.stats.examples_seen += _batch_length(batch)
        if selecting:
            self._select(batch, model, host_ids, loaded)
        else:
            self._push(dict(batch))

    def _decide_from_store(self, batch: dict) -> bool:
        """A stream's batch decided from its rows' stored losses (InfoBatch's rule by id, not by position):
        pruned rows were loaded but cost no forward or backward. False: the strategy decides after scoring."""
        (host_ids,) = transfer.to_host(batch[self.index_column])
        with self.stats.timer("selection_overhead_seconds"):
            stored, _ = self.store.lookup(host_ids)
            selection = self.selector.plan_rows(stored, self.generator, self.stream_rule, self.progress_now)
        if self.accelerator.num_processes > 1:
            check_plans_agree(self.selector, distributed.flags_of_every_rank(self.accelerator, selection is None))
        if selection is None:
            return False
        size = _batch_length(batch)
        self.stats.examples_seen += size
        self.stats.considered += size
        self.stats.kept += selection.indices.numel()
        device = _batch_device(batch)
        rows = _rows(batch, transfer.to_device(selection.indices, device))
        if selection.weights is not None:
            rows[WEIGHT_KEY] = transfer.to_device(selection.weights.float(), device)
        self._push(rows)
        return True

    def _planned_rows(self, batch: dict, host_ids: torch.Tensor, decided: torch.Tensor) -> dict:
        positions = decided.nonzero().squeeze(1)
        device = _batch_device(batch)
        rows = _rows(batch, transfer.to_device(positions, device))
        if self.epoch_plan.weights is not None:
            rows[WEIGHT_KEY] = transfer.to_device(self.epoch_plan.weights[host_ids[positions]], device)
        return rows

    def _select(self, batch: dict, model: torch.nn.Module, host_ids: torch.Tensor | None, loaded: dict) -> None:
        size = _batch_length(batch)
        losses = self.losses_for(batch, model, host_ids, loaded)
        with self.stats.timer("selection_overhead_seconds"):
            population = None
            # A stream without ids gathers placeholder ids: only the losses are used then.
            ids = batch.get(self.index_column, torch.zeros(size, dtype=torch.int64))
            failure, self._failure = self._failure, None
            if self.args.sb_history_scope == "global" and self.accelerator.num_processes > 1:
                all_ids, population, mine = distributed.gather_pairs(self.accelerator, ids, losses, failure)
                ids, losses = all_ids[mine], population[mine]
                population = self._ranked(all_ids, population)
            elif failure is not None:
                raise failure  # no gather follows to carry it to the other ranks (docs/distributed.md)
            elif self.selector.uses_reference_losses:
                ids, losses = transfer.to_host(ids.to(torch.int64), losses)  # still one copy
            else:
                (losses,) = transfer.to_host(losses)
            selection = self.selector.select(self._ranked(ids, losses), self.generator, population=population)
            self.stats.considered += size
            self.stats.kept += selection.indices.numel()
            nonfinite = int((~torch.isfinite(losses)).sum())
            self.stats.nonfinite_losses += nonfinite
            self._epoch_scored += size
            self._epoch_nonfinite += nonfinite
            device = _batch_device(batch)
            rows = _rows(batch, transfer.to_device(selection.indices, device))
            if selection.weights is not None:
                rows[WEIGHT_KEY] = transfer.to_device(selection.weights, device)
        self._push(rows)

    def _ranked(self, ids: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
        """What the strategy ranks: the losses, or for 'rholoss' the reducible losses (minus irreducible ones)."""
        if not self.selector.uses_reference_losses:
            return losses
        return self.irreducible.reducible(ids.cpu(), losses.cpu())

    def _push(self, rows: dict) -> None:
        if self.selector.produces_weights and WEIGHT_KEY not in rows:
            rows[WEIGHT_KEY] = torch.ones(_batch_length(rows), device=_batch_device(rows))
        self.queue.push(rows)

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
        size = _batch_length(batch)
        if not self.selector.needs_losses:
            return torch.zeros(size)
        ids = batch.get(self.index_column)  # None for a stream without ids (plain SB only)
        loaded = batch if loaded is None else loaded
        if not self.is_stale_epoch(self.epoch) or self.epoch_plan is not None:
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
        fresh = self._score(_rows(batch, rows), ids[rows], model, loaded)
        losses[unknown] = transfer.to_host(fresh)[0]
        return losses

    def _score(self, batch: dict, ids: torch.Tensor | None, model: torch.nn.Module, loaded: dict) -> torch.Tensor:
        """Losses of ``batch`` by a selection forward. A rank with no rows (another rank scores some) joins
        the store's collective, and runs a forward on one row of ``loaded`` when the weights are sharded; its
        losses are dropped.

        A ValueError of the per-example loss (a class label out of range, on this rank's rows only) is carried
        by the next gather of losses, so that every rank raises it (`distributed.gather_pairs`)."""
        size = _batch_length(batch)
        margins = None
        if size > 0:
            with self.stats.timer("selection_forward_seconds"):
                try:
                    inputs = {k: v for k, v in batch.items() if k != self.index_column}
                    if self.record is not None:
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
        if self.record is not None and size > 0:
            self.record.scored(ids, losses, margins, self.epoch)
        if self.records_training_losses:
            losses = self.observe(ids, losses)  # copied to the host with the ids, once
        return losses

    def observe(self, ids: torch.Tensor, losses: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Store losses of every rank's examples, so each rank holds the same store (a collective); returns
        this rank's ``losses`` on the host. ``labels``: the rows' class labels, stored too where the strategy
        budgets by class (in the same copy and gather as the losses)."""
        failure, self._failure = self._failure, None
        if labels is not None and self.labels is not None:
            all_ids, all_losses, all_labels, mine = distributed.gather_labelled(
                self.accelerator, ids, losses.detach(), labels.detach(), failure)
            self.labels.update(all_ids, all_labels)
        else:
            all_ids, all_losses, mine = distributed.gather_pairs(self.accelerator, ids, losses.detach(), failure)
        if self.sampler is None:  # a stream: ids size the store as they arrive
            streams.check_id_bound(all_ids, self.stats.examples_loaded, self.index_column)
        self.store.update(all_ids, all_losses, self.epoch)
        return all_losses[mine]


#: What a non-finite loss says about the run, in every error that stops it for one.
NONFINITE_CAUSE = (
    "The model's outputs are non-finite (diverged weights, a too-high learning rate, or broken inputs/labels)."
)


def check_plans_agree(selector: Selector, undecided: list[bool]) -> None:
    """`Selector.plan_rows` must return None on every rank or on none: ranks that score a batch gather its losses,
    and ranks that planned it would not join them."""
    if len(set(undecided)) > 1:
        ranks = [rank for rank, flag in enumerate(undecided) if flag]
        raise ValueError(
            f"{type(selector).__name__}.plan_rows returned None (score these rows) on rank(s) {ranks} of "
            f"{len(undecided)} and a selection on the others: it must return None on every rank or on none, "
            "deciding from the epoch's rule and the run's progress, which every rank shares"
        )


def model_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's saved buffers (BatchNorm running statistics, ...) as this process holds them.

    DDP copies rank 0's buffers to the other ranks only at the start of a training forward; in
    between, each rank's own training forward has updated its copy, and the selection forwards of
    the next step use it. The Trainer's checkpoint holds rank 0's model only, so without these a
    resumed rank scores its first selection batches with rank 0's statistics and selects other rows.
    """
    saved = model.state_dict().keys()
    return {name: value.detach().cpu().clone() for name, value in model.named_buffers() if name in saved}


def check_rows(batch: dict) -> None:
    """Every entry of a batch must hold one row per example: selection keeps and regroups rows."""
    sizes = {key: value.shape[0] if torch.is_tensor(value) and value.dim() > 0 else None
             for key, value in batch.items()}
    rows = next((size for size in sizes.values() if size is not None), None)
    for key, size in sizes.items():
        if size is None or size != rows:
            shape = tuple(batch[key].shape) if torch.is_tensor(batch[key]) else type(batch[key]).__name__
            raise ValueError(
                f"the batch entry {key!r} ({shape}) is not one row per example (the batch has {rows} rows): "
                "selection keeps or drops single rows, so it cannot split this entry. Packed or padding-free "
                "batches (TRL's packing=True / padding_free=True, DataCollatorWithFlattening) hold several "
                "examples in one row: pad the examples instead, or train with --sb_strategy none"
            )


def _rows(batch: dict, rows: torch.Tensor) -> dict:
    return {key: value[rows] for key, value in batch.items()}


def _batch_length(batch: dict) -> int:
    return next(iter(batch.values())).shape[0]


def _batch_device(batch: dict) -> torch.device:
    return next(iter(batch.values())).device
