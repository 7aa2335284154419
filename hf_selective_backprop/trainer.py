"""`SelectiveBackpropMixin`: a selection engine in front of each step of any `Trainer` subclass.

`SelectiveBackpropTrainer` is the mixin on transformers' `Trainer` (`seq2seq.py` and `sft.py` put it on
`Seq2SeqTrainer` and TRL's `SFTTrainer`). The Trainer's loop, optimizer step and gradient accumulation stay
untouched; the mixin only wires `SelectionEngine` into its hooks: the sampler (decisions before loading), the epoch
start, `get_batch_samples` (selection batches in, exactly `gradient_accumulation_steps` full micro-batches out),
`compute_loss` (weights, store refresh), logging and checkpoints; the run's length, budget and files are the engine's.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import Trainer

from . import _compat, checkpoint_hooks, deepspeed_notice, loss_check, selection_setup, step_losses
from .cards import write_trainer_card
from .config import SelectiveBackpropConfig, check_trainer_arguments, refuse_unsupported_trainer, selective_arguments
from .engine import SelectionEngine, budget, console, reference, rotation, run_signature, state_files
from .engine.accounting import STATS_FILE, finish_plain_run, finish_run, logged_counters, run_summary
from .engine.batch_rows import WEIGHT_KEY
from .engine.data_state import DataState, follow_plain_loader, read_plain
from .engine.epoch_plan import planned_sampler
from .engine.padding import queue_padding
from .engine.scoring import SelectionScorer, selection_model
from .losses import model_task, per_example_loss_for
from .lr_schedule import schedule_for
from .record import keeper as record_keeping
from .record import setup as record_setup

__all__ = ["STATS_FILE", "WEIGHT_KEY", "SelectiveBackpropMixin", "SelectiveBackpropTrainer"]

class SelectiveBackpropMixin:
    """Selection for a `transformers.Trainer` subclass: list it first, ``class T(SelectiveBackpropMixin, Trainer)``.

    The trainer's ``args`` must carry the `SelectiveBackpropArguments` fields (a dataclass that lists
    `SelectiveBackpropArguments` first among its bases, then the trainer's own arguments class).

    Args:
        per_example_loss_func: ``(outputs, labels) -> losses`` of shape (batch,), needed when
            the model's loss is not one the automatic per-example loss knows (and with ``compute_loss_func``).
        reference_model: for ``sb_strategy="rholoss"``, a model trained on held-out data whose loss on
            each training example is that example's irreducible loss (``--sb_reference_model`` loads
            one from a folder instead).
        Every other argument is the trainer's.
    """

    #: The engine class built for each training run; a subclass can record or change what it does.
    engine_class = SelectionEngine
    #: The arguments class that error messages suggest.
    config_class_name = "SelectiveBackpropConfig"
    #: How the wrapped trainer's compute_loss scales the loss over processes, which the weighted loss must match.
    loss_scale_rule = _compat.TRAINER_LOSS_SCALE
    #: Training loops started (train() calls, auto_find_batch_size restarts): each after the first gets a fresh engine.
    _loops_started = 0
    #: For 'rholoss': the column or reference model that gives the irreducible losses.
    _reference: reference.Reference | None = None
    #: The command-line flags the model was built from ({"--num_layers": 2, ...}), set by the scripts: recorded
    #: with each checkpoint, so that a resume with other ones is refused before data (run_signature.check_model_flags).
    model_flags: dict | None = None
    #: A run without selection given --sb_budget: the share of the full run's steps it takes.
    plain_budget: budget.PlainBudget | None = None
    #: The run's example record (--sb_record): made afresh by each training loop.
    record_keeper: record_keeping.RecordKeeper | None = None
    _records = False  # whether this trainer keeps one (record_setup.prepare)
    #: A run without selection whose dataset or collator augments: their random state, saved with each checkpoint.
    plain_data_state: DataState | None = None

    def __init__(self, *args, per_example_loss_func=None, reference_model=None, **kwargs):
        args, kwargs = selection_setup.with_default_arguments(self, args, kwargs)
        given = selective_arguments(args, kwargs)
        train_dataset = kwargs.get("train_dataset", args[3] if len(args) > 3 else None)
        # Before the Trainer's own refusal of a stream without max_steps, which does not name the budget.
        budget.refuse_unsized(given, train_dataset)
        selector = selection_setup.selector_before_data(self, given, train_dataset, per_example_loss_func)
        subset_record = record_setup.subset_record(given)  # read before the data is prepared
        with deepspeed_notice.quiet_unless_deepspeed(given):  # accelerate imports an installed DeepSpeed here
            super().__init__(*args, **kwargs)
        self.selector = selector
        with selection_setup.stepping_aside(self):
            check_trainer_arguments(self, per_example_loss_func)
        step_losses.set_up(self, per_example_loss_func)
        reference.refuse_unused(reference_model, self.selector, self.args.sb_strategy)
        self._records = record_setup.prepare(self, subset_record)
        console.show_fewer_counters(self)  # the sb/* counters a person reads; every one still goes to report_to
        if self.selector is not None:
            with selection_setup.stepping_aside(self):
                selection_setup.set_up_selection(self, reference_model, per_example_loss_func)

    def default_arguments(self, model):
        """The arguments of a trainer given none: the Trainer's default, with the sb_* fields' defaults."""
        return SelectiveBackpropConfig(output_dir="tmp_trainer")

    def _refuse_before_data(self, args, selector, per_example_loss_func) -> None:
        """What this trainer refuses before the wrapped trainer prepares its data (which can take long)."""
        refuse_unsupported_trainer(type(self), args)

    def _can_record(self) -> bool:
        """Whether this trainer's training batches hold one example per row, as the example record needs."""
        return True

    def _automatic_per_example_loss(self, label_smoothing: float):
        """The per-example loss matching the model's own, when the user passes none."""
        return per_example_loss_for(self.model, label_smoothing=label_smoothing, label_name=self.label_name)

    def _check_automatic_loss(self) -> None:
        """The automatic per-example loss against the model's own, on the first training rows (loss_check.py)."""
        loss_check.check_on_first_rows(self)

    def _build_engine(self) -> SelectionEngine:
        """Selection state for ``self.selector``: at construction, and fresh for each later training loop (a
        second train() call, or an auto_find_batch_size restart with a smaller batch)."""
        # Text rows from different selection batches have different lengths: re-pad each micro-batch.
        self._engine_batch_size = _compat.train_batch_size(self)  # the Trainer's, which the engine's sizes follow
        task = model_task(self.accelerator.unwrap_model(self.model))
        return self.engine_class(
            self.args, self.selector, self._selection_scorer(), self.accelerator, self._micro_batch_rows(),
            self._selection_batch_size(), padding=self._queue_padding(task != "classification", task == "seq2seq-lm"),
        )

    def _selection_scorer(self) -> SelectionScorer:
        # The Trainer's own input preparation (device, DeepSpeed's cast to the model's dtype) for selection too.
        return SelectionScorer.from_args(
            self.per_example_loss_func, self.label_name, self.args, prepare_inputs=_compat.input_preparation(self)
        )

    def _micro_batch_rows(self) -> int:
        """Rows of one training micro-batch, as the engine assembles it from the kept rows."""
        return _compat.train_batch_size(self)

    def _queue_padding(self, token_labels: bool, encoder_decoder: bool) -> dict:
        """How the queue pads text rows again: as the data collator padded them."""
        return queue_padding(self.data_collator, self.processing_class, self.label_name, token_labels, encoder_decoder)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self.selector is not None or self._records:
            _compat.add_signature_column(self, self.args.sb_index_column)

    def _selection_batch_size(self) -> int:
        return self.args.selection_batch_size(_compat.train_batch_size(self))

    # ---- data ----------------------------------------------------------------------------------

    def get_train_dataloader(self):
        if self.selector is None:
            with record_setup.ids_kept(self):
                loader = super().get_train_dataloader()
            return follow_plain_loader(self, loader)
        return selection_setup.selection_loader(self, self._get_train_sampler)

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if self.selector is None or sampler is None:
            return sampler
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        self._planned_sampler = planned_sampler(
            sampler, dataset, self.args, self._selection_batch_size(), self._plans_before_loading(dataset)
        )
        return self._planned_sampler

    def _plans_before_loading(self, dataset) -> bool:
        """Whether an epoch's plan decides ``dataset``'s rows before they are loaded."""
        return self.engine.plans_before_loading

    # ---- run length and schedule ---------------------------------------------------------------

    def set_initial_training_values(self, args, dataloader):
        values = super().set_initial_training_values(args, dataloader)
        if self.selector is None:  # the Trainer's values; the budget-matched plain run takes F of their steps
            self.plain_budget = None if args.sb_budget is None else budget.PlainBudget(args.sb_budget)
            return values if self.plain_budget is None else self.plain_budget.loop_values(values)
        values = selection_setup.loop_values(self, args, dataloader, values)
        self._expected_steps = values.max_steps
        return values

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        # An epoch's step count under selection is known only afterwards: the schedule follows the run's progress.
        schedule_for(self, scheduler, num_training_steps)
        return scheduler

    def training_progress(self) -> float:
        """Fraction of the run done: data read (epoch-based runs) or optimizer steps."""
        return self.engine.progress(self.state.global_step, self.state.max_steps)

    # ---- the training loop's hooks -------------------------------------------------------------

    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, *rest, **kwargs):
        trial = kwargs.get("trial", rest[0] if rest else None)
        selection_setup.start_loop(self, batch_size, trial, resume_from_checkpoint)
        return super()._inner_training_loop(batch_size, args, resume_from_checkpoint, *rest, **kwargs)

    def _init_training_state(self, max_steps, steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial):
        epochs_trained, skipped = super()._init_training_state(
            max_steps, steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        return checkpoint_hooks.resume(self, resume_from_checkpoint, epochs_trained, skipped)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.selector is None:
            return super().get_batch_samples(read_plain(self, epoch_iterator), num_batches, device)
        engine = self.engine
        engine.restore_model_buffers(self.accelerator.unwrap_model(self.model_wrapped))
        selecting = engine.selection_on(self.state.global_step, self.training_progress(), self.state.max_steps)
        ended = engine.fill_step(epoch_iterator, selecting, self._selection_model())
        if ended is not None:
            self.control.should_training_stop |= ended == "run"
            self.control.should_epoch_stop |= ended == "epoch"
            return [], None
        micro_batches = engine.next_step(device)
        return micro_batches, _compat.num_items_in_batch(self, micro_batches, device)

    def _selection_model(self) -> torch.nn.Module:
        return selection_model(self.model_wrapped, self.accelerator, self.args.sb_selection_precision)

    def training_step(self, model, inputs, *args, **kwargs):
        if self.selector is None:
            if self.record_keeper is None:
                return super().training_step(model, inputs, *args, **kwargs)
            with self._step_extras.carried(inputs, type(self).__name__, "none", False) as inputs:
                return super().training_step(model, inputs, *args, **kwargs)
        refreshes = self.engine.records_training_losses
        with self._step_extras.carried(inputs, type(self).__name__, self.args.sb_strategy, refreshes) as inputs:
            loss = super().training_step(model, inputs, *args, **kwargs)
        # Checked before the optimizer step (SelectionFlowCallback): the Trainer's logging_nan_inf_filter
        # only hides such a loss from the logs.
        self.engine.observe_training_loss(loss)
        return self._logged_loss.step_loss(loss)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.selector is None and self.record_keeper is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs, ids, weights = self._step_extras.take(inputs, model.training)
        labels = inputs.get(self.label_name)
        reads = step_losses.step_reads(self, model.training, labels, ids, weights)
        if reads is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        try:
            loss, outputs = self._loss_and_outputs(model, inputs, num_items_in_batch)
        except (IndexError, RuntimeError) as error:
            step_losses.name_bad_labels(self, labels, ids)
            raise error
        loss = step_losses.read_step_losses(self, loss, outputs, labels, ids, weights, num_items_in_batch, reads)
        return (loss, outputs) if return_outputs else loss

    def _loss_and_outputs(self, model, inputs, num_items_in_batch):
        """The trainer's own loss and the outputs of the forward it was computed from."""
        return super().compute_loss(model, inputs, True, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if self.selector is not None or self._records:
            inputs = {k: v for k, v in inputs.items() if k != self.args.sb_index_column}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def evaluate(self, *args, **kwargs):
        if self.selector is None:
            return super().evaluate(*args, **kwargs)
        with self.engine.stats.timer("eval_seconds"):
            return super().evaluate(*args, **kwargs)

    # ---- accounting ----------------------------------------------------------------------------

    def selection_summary(self) -> dict:
        """The run's counters summed over processes, with derived figures (a collective)."""
        summary = run_summary(self.accelerator, self.engine.stats, getattr(self, "_train_start", None))
        return {**summary, **self.engine.budget_summary()}

    def log(self, logs, start_time=None):
        # A training log carries the run's counters, added in place: the Trainer completes the same dict (its
        # epoch; the console callbacks take total_flos out), which train() then returns as its metrics.
        if "loss" in logs or "train_runtime" in logs:
            logs.update(logged_counters(self))
        if "loss" in logs:
            self._logged_loss.add_to(logs, self.state.global_step, self.args.parallel_mode)
        super().log(logs, start_time)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        resume_from_checkpoint = state_files.resume_target(self, resume_from_checkpoint)
        run_signature.PlainRunSignature.attach(self)  # without selection: the budget and model flags a resume compares
        try:
            output = super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            if self.selector is not None:
                self._flow_callback.stop_filtering()
                rotation.train_ended(self)
        # A hyperparameter search's trial writes into its own folder, as its checkpoints go.
        folder = _compat.output_dir(self, kwargs.get("trial", args[0] if args else None))
        if self.selector is not None:
            self.sb_stats = finish_run(self, output.metrics, self._expected_steps, folder)
        else:
            self.sb_stats = finish_plain_run(self, output.metrics, folder)
        record_setup.write(self, folder)
        return output

    def create_model_card(self, *args, **kwargs):
        # The Selective-Backprop card (settings, savings, accuracy) in place of the Trainer's generic one.
        return write_trainer_card(self, *args, **kwargs)

    # ---- checkpoints ---------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        checkpoint_hooks.save(self, model, trial, partial(super()._save_checkpoint, model, trial))

    def _load_best_model(self):
        super()._load_best_model()
        if self.selector is not None:
            rotation.best_model_loaded(self)


class SelectiveBackpropTrainer(SelectiveBackpropMixin, Trainer):
    """A drop-in `Trainer` that backpropagates only selected examples: `transformers.Trainer`'s arguments, and
    `SelectiveBackpropMixin`'s (``per_example_loss_func``, ``reference_model``)."""
