"""`SelectionEngine`: everything selection holds between steps, and the one place that changes it.

Data flows one way through it (docs/architecture.md):

    begin_epoch   -> plan: examples decided before loading (uniform, Stale-SB's stale epochs, ...)
    add_batch     -> loaded selection batch: planned rows straight to the queue, the others
                     scored (selection forward, or a stored loss) and selected
    next_step     -> exactly gradient_accumulation_steps micro-batches of exactly the batch size
    observe       -> training-forward losses refresh the per-example store
    end_epoch

The engine tells that story; each part of it is a collaborator that holds its own state: the epoch's plan and
read position (`EpochPlanner`), the losses and their store (`LossSource`), the rows read, selected and queued
(`StepFiller`), a budget run's spending (`BudgetMeter`) and the checks of non-finite losses (`NonfiniteGuard`).
Its state goes into checkpoints through ``state_dict`` / ``load_state_dict`` (files: `state_files`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from accelerate import Accelerator

from ..selectors import Selector
from . import distributed
from .accounting import SelectionStats, merged_stats
from .budget import BudgetPlan
from .budget_meter import BudgetMeter
from .data_state import DataState
from .delegation import Held
from .epoch_plan import PlannedSampler
from .epoch_planner import EpochPlanner
from .loss_source import LossSource
from .model_buffers import ResumedBuffers, model_buffers
from .nonfinite import NonfiniteGuard
from .schedule import in_selection_window, is_interrupt_step
from .scoring import SelectionScorer
from .step_filler import StepFiller


class SelectionEngine:
    """Strategy, loss history (inside the strategy), store, queue, generator and counters of one process.

    ``args`` is the `SelectiveBackpropConfig`; ``batch_size`` the training micro-batch size and
    ``selection_batch_size`` the rows of one loaded selection batch, per process; ``padding`` the
    `BatchQueue` pad values and side for variable-length (text) rows. ``forwards_in_lockstep``: whether
    every rank must run each selection forward together (weights sharded by DeepSpeed ZeRO-3 or FSDP);
    by default read from ``accelerator``.
    """

    # What the trainer, its callbacks and subclasses read (or set) on the engine, held by the collaborator that
    # owns it: the epoch and its plan,
    epoch = Held("planner")
    epoch_plan = Held("planner")
    stream_rule = Held("planner")
    resumed_position = Held("planner")
    batches_read = Held("planner")
    steps_in_epoch = Held("planner")
    epoch_without_step = Held("planner")
    plans_before_loading = Held("planner")
    epochs_read = Held("planner")
    # the losses (``_score``: a recording subclass wraps each selection forward),
    store = Held("loss_source")
    labels = Held("loss_source")
    irreducible = Held("loss_source")
    record = Held("loss_source")
    records_training_losses = Held("loss_source")
    use_irreducible = Held("loss_source")
    observe = Held("loss_source")
    _score = Held("loss_source")
    # the queue (``_push``: every row queued to train passes there),
    queue = Held("step_filler")
    data_state = Held("step_filler")
    _push = Held("step_filler")
    # a budget run's spending, the non-finite checks and the model buffers of a resumed rank.
    budget = Held("budget_meter")
    budget_spent = Held("budget_meter", "spent")
    budget_done = Held("budget_meter", "done")
    phi_meter = Held("budget_meter")
    budget_summary = Held("budget_meter", "summary")
    observe_training_loss = Held("nonfinite")
    fail_if_training_loss_was_nonfinite = Held("nonfinite")
    restore_model_buffers = Held("resumed_buffers", "restore")

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
        self.stats = SelectionStats()
        if args.sb_sync_timers and accelerator.device.type != "cpu":
            self.stats.synchronize = partial(torch.accelerator.synchronize, accelerator.device)
        self.generator = torch.Generator().manual_seed(args.seed + 1_000_003 * args.process_index)
        self.run: dict | None = None  # what the run is (run_signature.describe): saved with checkpoints
        self.epoch_based = True  # epoch-based runs end with their data, others by steps (set_run_length)
        self.planner = EpochPlanner(args, selector, accelerator, self.stats, selection_batch_size)
        self.loss_source = LossSource(args, selector, scorer, accelerator, self.stats, self.planner,
                                      forwards_in_lockstep)
        self.nonfinite = NonfiniteGuard(accelerator, self.stats)
        self.step_filler = StepFiller(args, selector, scorer, accelerator, self.stats, self.generator, self.planner,
                                      self.loss_source, self.nonfinite, batch_size, padding)
        self.budget_meter = BudgetMeter(accelerator, self.stats, selector)
        self.resumed_buffers = ResumedBuffers()

    # ---- set-up ------------------------------------------------------------------------------

    def attach(self, dataloader, sampler: PlannedSampler | None, data_state: DataState, run: dict) -> None:
        """The training loader (its length per epoch), its sampler (the plan it follows), the random state of
        its dataset and collator, and the run's signature."""
        self.planner.dataloader, self.planner.sampler = dataloader, sampler
        self.data_state, self.run = data_state, run
        self.loss_source.attach(sampler)

    def set_run_length(self, epoch_based: bool, budget: BudgetPlan | None = None,
                       replan: Callable[[float], BudgetPlan] | None = None) -> None:
        """Whether the run ends when its data does (epoch-based), when ``budget`` is spent, or after a number of
        steps. ``replan`` makes the budget's plan from a measured phi (a plan whose phi is being measured)."""
        self.epoch_based = epoch_based and budget is None
        self.budget_meter.start(budget, replan)

    @property
    def follows_progress(self) -> bool:
        """Whether the run's end and its schedule follow its progress (data read, or budget spent), not its steps
        alone: an epoch's step count under selection is known only afterwards."""
        return self.epoch_based or self.budget is not None

    # ---- state -------------------------------------------------------------------------------

    def state_dict(self, model: torch.nn.Module | None = None) -> dict:
        """``{"shared": ..., "rank": ...}``: what every process holds alike (the strategy, store, epoch, plan and
        position, the run's signature, a budget run's spending; saved once) and what this process owns (generator,
        queue, counters, strategy, data pipeline state and, with several processes, ``model``'s buffers)."""
        shared = {
            "selector": self.selector.state_dict(),
            **self.loss_source.state_dict(),
            **self.planner.state_dict(),
            "run": self.run,
            **self.budget_meter.state_dict(),
        }
        rank = {
            "generator": self.generator.get_state(),
            **self.step_filler.state_dict(),
            "stats": self.stats.state_dict(),
            # Per rank too: a 'local' history scope (or kath18's running tau) differs between ranks.
            "selector": self.selector.state_dict(),
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
        shared, ranks = state["shared"], state["ranks"]
        self.selector.load_state_dict(shared["selector"])
        self.loss_source.load_state_dict(shared)
        self.planner.load_state_dict(shared, ignore_data_skip)
        self.budget_meter.load_state_dict(shared)
        own = ranks.get(self.args.process_index)
        self.step_filler.load_state_dict(ranks, own)
        if own is not None:
            self.generator.set_state(own["generator"])
            self.selector.load_state_dict(own["selector"])
            self.resumed_buffers.saved = own.get("model_buffers")
        if shared["world_size"] == self.accelerator.num_processes:
            self.stats.load_state_dict(own["stats"])
        elif ranks:
            self.stats.load_state_dict(merged_stats([saved["stats"] for saved in ranks.values()]))
        return sorted(ranks)

    # ---- epochs ------------------------------------------------------------------------------

    def begin_epoch(self, epoch: int, num_epochs: float, epoch_based: bool) -> None:
        """Decide, before loading, what the epoch loads (a collective: call on every process)."""
        self.planner.begin(epoch, num_epochs, epoch_based, self.loss_source)

    def end_epoch(self) -> None:
        """Stop a run whose epoch could train nothing (every loss non-finite), else move on to the next epoch."""
        planned = self.epoch_plan is not None and bool(self.epoch_plan.copies.any())
        self.nonfinite.fail_if_every_loss_was_nonfinite(self.epoch, planned)
        self.planner.end()

    def read_all_asked(self) -> bool:
        """True once an epoch-based run has read the share of its last epoch that a fractional
        num_train_epochs asks for (a whole last epoch ends by running out of data instead)."""
        if self.budget is not None:
            return self.budget_done
        unfinished = self.batches_read < self.planner.batches_in_epoch
        return self.epoch_based and unfinished and self.epochs_read() >= self.args.num_train_epochs

    def progress(self, global_step: int, max_steps: int) -> float:
        """Fraction of the run done: budget spent (budget runs), data read (epoch-based runs) or optimizer steps."""
        if self.budget is not None:
            return self.budget_meter.progress()
        if self.epoch_based:
            return min(self.epochs_read() / self.args.num_train_epochs, 1.0)
        return min(global_step / max_steps, 1.0)

    # ---- steps -------------------------------------------------------------------------------

    def selection_on(self, global_step: int, progress: float, max_steps: int) -> bool:
        """Whether the rows read now are selected: after warm-up, inside sb_start/sb_end, not an interrupt."""
        self.step_filler.progress_now = progress
        if self.epoch < self.args.sb_warmup_epochs or is_interrupt_step(global_step, self.args.sb_interrupt):
            return False
        # The window is a share of the run's progress, like the LR schedule.
        return in_selection_window(int(progress * max_steps), max_steps, self.args.sb_start, self.args.sb_end)

    def fill_step(self, epoch_iterator, selecting: bool, model: torch.nn.Module) -> str | None:
        """Read and select selection batches until every process holds a full optimizer step (None), or until
        "epoch" (the epoch's data ran out, on some process) or "run" (an epoch-based run read the share of its
        last epoch that a fractional num_train_epochs asks for) ends first. A collective."""
        filler = self.step_filler
        while not filler.ready():
            if self.read_all_asked():  # not one selection batch more than the fraction
                return "run"
            batch = filler.read(epoch_iterator)
            if not distributed.all_true(self.accelerator, batch is not None):
                self.end_epoch()
                return "epoch"
            if not filler.inputs_checked:
                filler.check_inputs(batch, model)
            self.add_batch(batch, selecting, model)
        return None

    def add_batch(self, batch: dict, selecting: bool, model: torch.nn.Module) -> None:
        """Queue a loaded selection batch's rows to train: all, the planned ones, or those selected."""
        self.batches_read += 1
        self.step_filler.add_batch(batch, selecting, model)

    def next_step(self, device) -> list[dict]:
        """The optimizer step's micro-batches; a budget run then counts what it has spent, up to this step."""
        micro_batches = self.step_filler.next_step(device)
        self.steps_in_epoch += 1
        self.budget_meter.count()
        return micro_batches
