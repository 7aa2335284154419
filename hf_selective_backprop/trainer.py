"""`SelectiveBackpropTrainer`: transformers' Trainer with a selection pass in front of each step.

The Trainer's own loop, optimizer step and gradient accumulation stay untouched. Selection
lives in `get_batch_samples`: it reads *selection batches* from the epoch iterator, scores
them (or, in a Stale-SB epoch, looks their losses up), queues the chosen rows and hands
back exactly `gradient_accumulation_steps` micro-batches of exactly the training batch size.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from functools import partial

import numpy
import torch
from datasets import Dataset as HFDataset
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, has_length

from . import distributed
from .accounting import COUNTERS, TIMERS, SelectionStats, summarize
from .checkpoints import RANK_STATE_FILE, STATE_FILE, atomic_save, last_complete_checkpoint
from .config import SelectiveBackpropConfig
from .losses import model_task, per_example_loss_for, weighted_loss
from .padding import queue_padding
from .plan import TrainingPlan
from .queue import BatchQueue
from .schedule import in_selection_window, is_interrupt_step
from .scoring import SelectionScorer
from .selectors import build_selector
from .store import LossStore

STATS_FILE = "sb_stats.json"
WEIGHT_KEY = "sb_weight"


class _IndexedDataset(Dataset):
    """Adds a stable id (the position) to each example of a map-style dataset of dicts."""

    def __init__(self, dataset, column: str):
        self.dataset, self.column = dataset, column

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, position: int) -> dict:
        return {**self.dataset[position], self.column: position}


class _SelectionFlowCallback(TrainerCallback):
    """Keeps the Trainer's bookkeeping honest when steps per epoch vary with selection."""

    def __init__(self, trainer: SelectiveBackpropTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        run = self.trainer
        state.epoch = run._epoch + run._consumed / max(run._plan.selection_batches_per_epoch, 1)
        if run._epoch_based:
            # max_steps holds the *expected* step count; an epoch-based run ends when its data
            # does (a fractional num_train_epochs included), not at the estimate.
            control.should_training_stop = run.training_progress() >= 1.0
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        # An epoch whose kept rows all stayed queued made no step; the Trainer reads that as
        # an empty dataset and stops. The rows carry over, so training goes on.
        run = self.trainer
        state.epoch = run._epoch + run._consumed / max(run._plan.selection_batches_per_epoch, 1)
        if run._epoch_without_step and run.training_progress() < 1.0:
            control.should_training_stop = False
        return control


class SelectiveBackpropTrainer(Trainer):
    """A drop-in `Trainer` that backpropagates only selected examples.

    Args:
        per_example_loss_func: ``(outputs, labels) -> losses`` of shape (batch,), needed when
            the model's loss is not single-label cross-entropy (and with ``compute_loss_func``).
        Every other argument is `transformers.Trainer`'s.
    """

    def __init__(self, *args, per_example_loss_func=None, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, SelectiveBackpropConfig):
            raise TypeError(
                f"SelectiveBackpropTrainer needs args of type SelectiveBackpropConfig, got {type(self.args).__name__}"
            )
        if self.compute_loss_func is not None and per_example_loss_func is None and self.args.sb_strategy != "none":
            raise ValueError(
                "compute_loss_func is set, so selection cannot know each example's loss: pass "
                "per_example_loss_func=(outputs, labels) -> per-example losses as well"
            )
        # The label smoother's factor: the Trainer drops it for multi-label classification.
        smoothing = self.label_smoother.epsilon if self.label_smoother is not None else 0.0
        self.per_example_loss_func = per_example_loss_func or per_example_loss_for(
            self.model, label_smoothing=smoothing, label_name=self.label_names[0] if self.label_names else "labels"
        )
        self.selector = build_selector(self.args)
        if self.selector is None:
            return
        self.label_name = self.label_names[0] if self.label_names else "labels"
        self.scorer = SelectionScorer(
            self.per_example_loss_func,
            label_name=self.label_name,
            mode=self.args.sb_selection_mode,
            precision=self.args.sb_selection_precision,
            scale=self.args.sb_selection_scale,
            channels_last=self.args.sb_selection_channels_last,
            inference_mode=self.args.sb_selection_inference_mode,
        )
        if self.train_dataset is not None:
            self.train_dataset = self._with_index_column(self.train_dataset)
        self.add_callback(_SelectionFlowCallback(self))
        self._reset_selection_state()

    # ---- set-up -------------------------------------------------------------------------

    def _with_index_column(self, dataset):
        column = self.args.sb_index_column
        if isinstance(dataset, torch.utils.data.IterableDataset):
            if self.args.sb_staleness > 1:
                raise ValueError("--sb_staleness > 1 needs a map-style dataset: an IterableDataset has no stable ids")
            return dataset
        column_names = getattr(dataset, "column_names", None)
        if column_names is not None:
            if column in column_names:
                return dataset
            return dataset.add_column(column, list(range(len(dataset))))
        if len(dataset) and isinstance(dataset[0], dict) and column in dataset[0]:
            return dataset
        return _IndexedDataset(dataset, column)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self.selector is not None and self.args.sb_index_column not in self._signature_columns:
            self._signature_columns.append(self.args.sb_index_column)

    def _reset_selection_state(self) -> None:
        """Fresh selection state: at construction and at each (auto_find_batch_size) restart."""
        self.selector = build_selector(self.args)
        # Text rows from different selection batches have different lengths: re-pad each micro-batch.
        token_labels = model_task(self.accelerator.unwrap_model(self.model)) != "classification"
        padding = queue_padding(self.data_collator, self.processing_class, self.label_name, token_labels)
        self.queue = BatchQueue(**padding)
        self.store = LossStore()
        self.stats = SelectionStats()
        self.generator = torch.Generator().manual_seed(self.args.seed + 1_000_003 * self.args.process_index)
        self._epoch = 0
        self._consumed = 0
        self._skip_on_resume = 0
        self._resume_checkpoint = None
        self._epoch_without_step = False
        self._steps_in_epoch = 0
        self._epoch_scored = self._epoch_nonfinite = 0
        self._selection_inputs_checked = False

    def get_train_dataloader(self):
        if self.selector is None:
            return super().get_train_dataloader()
        self._check_train_dataset(self.train_dataset)
        # The loader yields selection batches; training batches are assembled from them.
        train_batch_size = self._train_batch_size
        self._train_batch_size = self._selection_batch_size(train_batch_size)
        try:
            return super().get_train_dataloader()
        finally:
            self._train_batch_size = train_batch_size

    def _check_train_dataset(self, dataset) -> None:
        """Fail at train start, with the flag to change, on data that selection cannot use.

        Also sizes the Stale-SB store for the largest id up front: grown batch by batch, it would be
        reallocated each time a larger id shows up (~2.7x its final size at peak, docs/reliability.md).
        """
        if dataset is None or not has_length(dataset):
            return
        if len(dataset) == 0:
            raise ValueError("the training dataset is empty")
        column = self.args.sb_index_column
        capacity = len(dataset) if isinstance(dataset, _IndexedDataset) else 0
        if self.args.sb_staleness > 1 and isinstance(dataset, HFDataset) and column in dataset.column_names:
            # Stale-SB keys stored losses by this column: a duplicate would share (and overwrite) one slot.
            ids = _column_values(dataset, column)
            if ids.ndim != 1 or ids.dtype.kind not in "iu" or (ids.size and ids.min() < 0):
                raise ValueError(
                    f"--sb_index_column {column!r} must hold one non-negative integer id per example for "
                    f"--sb_staleness > 1, got dtype {ids.dtype} and shape {ids.shape}"
                )
            unique = numpy.unique(ids)
            if unique.size != ids.size:
                raise ValueError(
                    f"--sb_index_column {column!r} holds {ids.size - unique.size} duplicate ids: Stale-SB stores "
                    "one loss per id, so every example needs its own (remove the column to number rows 0..N-1)"
                )
            capacity = int(ids.max()) + 1
        if self.args.sb_staleness > 1 and capacity and len(self.store) == 0:
            self.store = LossStore(capacity)

    def _selection_batch_size(self, train_batch_size: int) -> int:
        if self.args.sb_selection_batch_size is not None:
            return self.args.sb_selection_batch_size
        if self.args.sb_strategy == "kath18":
            return math.ceil(self.args.sb_presample_value * train_batch_size)
        return train_batch_size

    def set_initial_training_values(self, args, dataloader):
        values = super().set_initial_training_values(args, dataloader)
        if self.selector is None:
            return values
        num_train_epochs, _, num_examples, num_train_samples, total_batch_size, _, max_steps = values
        grad_accum = args.gradient_accumulation_steps
        selection_batch_size = self._selection_batch_size(self._train_batch_size)
        if not has_length(dataloader):
            # A stream (IterableDataset): the Trainer demands max_steps, so the run is step-based and
            # its values stand; an epoch is one pass of the stream, of unknown length.
            self._plan = TrainingPlan(
                rows_per_epoch=0,
                selection_batches_per_epoch=sys.maxsize,
                selection_batch_size=selection_batch_size,
                rows_per_step=self._train_batch_size * grad_accum,
                keep=self.selector.expected_keep_fraction(),
                active_share=1.0,
                warmup_epochs=args.sb_warmup_epochs,
            )
            self._epoch_based = False
            self._expected_steps = max_steps
            return values
        if not len(dataloader):
            raise ValueError("the training dataset is empty")
        rows_per_epoch = min(
            len(dataloader) * selection_batch_size, math.ceil(num_examples / self.accelerator.num_processes)
        )
        active = (args.sb_end - args.sb_start) * (1.0 - 1.0 / args.sb_interrupt if args.sb_interrupt else 1.0)
        self._plan = TrainingPlan(
            rows_per_epoch=rows_per_epoch,
            selection_batches_per_epoch=len(dataloader),
            selection_batch_size=selection_batch_size,
            rows_per_step=self._train_batch_size * grad_accum,
            keep=self.selector.expected_keep_fraction(),
            active_share=active,
            warmup_epochs=args.sb_warmup_epochs,
        )
        kept_per_epoch = rows_per_epoch * self._plan.expected_keep()
        if kept_per_epoch < self._plan.rows_per_step:
            raise ValueError(
                f"an epoch of {rows_per_epoch} examples per process keeps about {kept_per_epoch:.0f}, fewer than "
                f"one optimizer step needs ({self._train_batch_size} x {grad_accum} gradient accumulation): "
                "use a larger dataset, a smaller --per_device_train_batch_size or a larger --sb_keep"
            )
        micro_batches = self._plan.max_micro_batches_per_epoch(grad_accum)
        self._epoch_based = args.max_steps <= 0
        if self._epoch_based:
            max_steps = self._plan.expected_steps(args.num_train_epochs)
        else:
            # A step-based run reads as many epochs as its steps need.
            num_train_epochs = sys.maxsize
        self._expected_steps = max_steps
        return (
            num_train_epochs,
            micro_batches // grad_accum,
            num_examples,
            num_train_samples,
            total_batch_size,
            micro_batches,
            max_steps,
        )

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if self.selector is not None and isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
            # How many examples selection keeps drifts as losses fall, so the number of steps an
            # epoch makes is only known afterwards. The schedule follows the run's progress
            # instead, scaled to the expected step count: it ends exactly when the data does.
            scheduler.lr_lambdas = [
                partial(_lambda_at_progress, fn, self, num_training_steps) for fn in scheduler.lr_lambdas
            ]
        return scheduler

    def _inner_training_loop(self, batch_size=None, args=None, resume_from_checkpoint=None, *rest, **kwargs):
        if self.selector is not None:
            self._reset_selection_state()
            self._train_start = time.perf_counter()
        return super()._inner_training_loop(batch_size, args, resume_from_checkpoint, *rest, **kwargs)

    def _init_training_state(self, max_steps, steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial):
        epochs_trained, skipped = super()._init_training_state(
            max_steps, steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        if self.selector is None or resume_from_checkpoint is None:
            return epochs_trained, skipped
        self._load_selection_state(resume_from_checkpoint)
        # The Trainer's resume arithmetic assumes a fixed number of batches per step; the
        # saved position says how many selection batches of the epoch were read.
        return self._epoch, 0

    # ---- the selection step ---------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.selector is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        if self._skip_on_resume:
            self._skip_batches(epoch_iterator)
        grad_accum = self.args.gradient_accumulation_steps
        batch_size = self._train_batch_size
        selecting = self._selection_on()
        while not distributed.all_true(self.accelerator, len(self.queue) >= batch_size * grad_accum):
            with self.stats.timer("data_seconds"):
                batch = next(epoch_iterator, None)
            if not distributed.all_true(self.accelerator, batch is not None):
                self._end_epoch()
                return [], None
            self._consumed += 1
            if not self._selection_inputs_checked:
                self._check_selection_inputs(batch)
            self._enqueue(batch, selecting)
        with self.stats.timer("selection_overhead_seconds"):
            micro_batches = [
                {k: v.to(device, non_blocking=True) for k, v in self.queue.pop(batch_size).items()}
                for _ in range(grad_accum)
            ]
        trained = batch_size * grad_accum
        self.stats.training_forwards += trained
        self.stats.backwards += trained
        self.stats.optimizer_steps += 1
        self._steps_in_epoch += 1
        return micro_batches, self._get_num_items_in_batch(micro_batches, device)

    def _check_selection_inputs(self, batch: dict) -> None:
        """At the run's first batch, one selection forward on one example: a model that cannot take
        --sb_selection_scale / --sb_selection_channels_last inputs fails now, not when the schedule
        (sb_start, warm-up epochs) first turns selection on."""
        self._selection_inputs_checked = True
        if self.selector.needs_losses:
            inputs = {k: v[:1] for k, v in batch.items() if k != self.args.sb_index_column}
            self.scorer.check_inputs(self._selection_model(), inputs)

    def _end_epoch(self) -> None:
        self._fail_if_every_loss_was_nonfinite()
        self._epoch_without_step = self._steps_in_epoch == 0
        self.control.should_epoch_stop = True
        self._epoch += 1
        self._consumed = 0
        self._steps_in_epoch = 0
        self._epoch_scored = self._epoch_nonfinite = 0

    def _fail_if_every_loss_was_nonfinite(self) -> None:
        """Stop a run that cannot progress: every loss scored this epoch (on some rank) was NaN/inf.

        Such rows are never kept, so nothing is trained; a step-based run would read epochs forever.
        """
        stuck = self._epoch_scored > 0 and self._epoch_nonfinite == self._epoch_scored
        if distributed.all_true(self.accelerator, not stuck):
            return
        raise RuntimeError(
            f"every per-example loss scored in epoch {self._epoch} was NaN or inf (this process: "
            f"{self._epoch_nonfinite} of {self._epoch_scored} non-finite): selection never keeps such "
            "examples, so training cannot make progress. The model's outputs are non-finite (diverged "
            "weights, a too-high learning rate, or broken inputs/labels)."
        )

    def _skip_batches(self, epoch_iterator) -> None:
        """Fast-forward a resumed epoch past the selection batches read before the checkpoint."""
        for _ in range(self._skip_on_resume):
            next(epoch_iterator)
        self._consumed = self._skip_on_resume
        self._skip_on_resume = 0
        # As the Trainer does after skipping: continue with the RNG state of the checkpoint.
        self._load_rng_state(self._resume_checkpoint)

    def _selection_on(self) -> bool:
        if self._epoch < self.args.sb_warmup_epochs:
            return False
        if is_interrupt_step(self.state.global_step, self.args.sb_interrupt):
            return False
        # The sb_start/sb_end window is a share of the run's progress, like the LR schedule.
        total = self.state.max_steps
        return in_selection_window(int(self.training_progress() * total), total, self.args.sb_start, self.args.sb_end)

    def _is_stale_epoch(self) -> bool:
        return (self._epoch - self.args.sb_warmup_epochs) % self.args.sb_staleness != 0

    def _enqueue(self, batch: dict, selecting: bool) -> None:
        size = _batch_length(batch)
        self.stats.examples_seen += size
        if not selecting:
            rows = dict(batch)
        else:
            losses = self._losses_for(batch)
            with self.stats.timer("selection_overhead_seconds"):
                losses = losses.cpu()
                population = None
                if self.args.sb_history_scope == "global":
                    # A stream without ids gathers placeholder ids: only the losses are used here.
                    ids = batch.get(self.args.sb_index_column, torch.zeros(size, dtype=torch.int64))
                    population = distributed.gather_pairs(self.accelerator, ids, losses)[1]
                selection = self.selector.select(losses, self.generator, population=population)
                self.stats.considered += size
                self.stats.kept += selection.indices.numel()
                nonfinite = int((~torch.isfinite(losses)).sum())
                self.stats.nonfinite_losses += nonfinite
                self._epoch_scored += size
                self._epoch_nonfinite += nonfinite
                indices = selection.indices.to(_batch_device(batch))
                rows = {key: value[indices] for key, value in batch.items()}
                if selection.weights is not None:
                    rows[WEIGHT_KEY] = selection.weights.to(_batch_device(batch))
        if self.selector.produces_weights and WEIGHT_KEY not in rows:
            rows[WEIGHT_KEY] = torch.ones(_batch_length(rows), device=_batch_device(batch))
        self.queue.push(rows)

    def _losses_for(self, batch: dict) -> torch.Tensor:
        """Per-example losses of a selection batch: a selection forward, or stored ones."""
        size = _batch_length(batch)
        if not self.selector.needs_losses:
            return torch.zeros(size)
        ids = batch.get(self.args.sb_index_column)  # None for a stream without ids (plain SB only)
        if self.args.sb_staleness == 1:
            return self._score(batch, ids)
        if not self._is_stale_epoch():
            return self._score(batch, ids)
        losses, _ = self.store.lookup(ids)
        unknown = torch.isnan(losses)
        self.stats.stale_lookups += size - int(unknown.sum())
        if unknown.any():
            # Examples never scored (e.g. new ids) still need one forward to be ranked.
            rows = unknown.nonzero().squeeze(1).to(ids.device)
            subset = {key: value[rows] for key, value in batch.items()}
            losses[unknown] = self._score(subset, ids[rows]).cpu()
        elif self.accelerator.num_processes > 1:
            # Keep the store's collective in lockstep with ranks that did score something.
            self._record(ids[:0], torch.zeros(0))
        return losses

    def _score(self, batch: dict, ids: torch.Tensor) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != self.args.sb_index_column}
        model = self._selection_model()
        with self.stats.timer("selection_forward_seconds"):
            losses = self.scorer(model, inputs)
        self.stats.selection_forwards += _batch_length(batch)
        if self.args.sb_staleness > 1:
            self._record(ids, losses)
        return losses

    def _record(self, ids: torch.Tensor, losses: torch.Tensor) -> None:
        """Store losses of every rank's examples, so each rank holds the same store."""
        all_ids, all_losses = distributed.gather_pairs(self.accelerator, ids, losses.detach())
        self.store.update(all_ids, all_losses, self._epoch)

    def _selection_model(self) -> torch.nn.Module:
        # Under DDP a forward of the wrapper syncs buffers, a collective that ranks scoring
        # different numbers of rows would not match; the inner module (which keeps
        # Accelerate's autocast patch) needs no collective. FSDP/DeepSpeed must use the wrapper.
        wrapped = self.model_wrapped
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
            return wrapped.module
        return wrapped

    def training_progress(self) -> float:
        """Fraction of the run done: data read (epoch-based runs) or optimizer steps."""
        if self._epoch_based:
            epochs = self._epoch + self._consumed / self._plan.selection_batches_per_epoch
            return min(epochs / self.args.num_train_epochs, 1.0)
        return min(self.state.global_step / self.state.max_steps, 1.0)

    # ---- losses during training and evaluation --------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.selector is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = dict(inputs)
        ids = inputs.pop(self.args.sb_index_column, None)
        weights = inputs.pop(WEIGHT_KEY, None)
        labels = inputs.get(self.label_name)
        loss, outputs = super().compute_loss(model, inputs, True, num_items_in_batch)
        if model.training and labels is not None and (weights is not None or self._refreshes_store()):
            if weights is None:
                per_example = self.per_example_loss_func(outputs, labels)
            else:
                # Same normaliser as the model's own loss: the step's item count (tokens for token-level
                # losses) when the Trainer passes one (the loss is then already scaled for accumulation).
                loss, per_example = weighted_loss(self.per_example_loss_func, outputs, labels, weights,
                                                  num_items_in_batch)
                if (
                    self.args.average_tokens_across_devices
                    and (self.model_accepts_loss_kwargs or self.compute_loss_func)
                    and num_items_in_batch is not None
                ):
                    # The count is then summed over ranks, and DDP averages gradients over ranks:
                    # scale back up exactly as Trainer.compute_loss scales the model's own loss.
                    n_gpu = self.args.n_gpu
                    loss = loss * (self.accelerator.num_processes // self.get_tp_size() if n_gpu <= 1 else n_gpu)
            if self._refreshes_store() and ids is not None:
                # A trained example's training-forward loss is fresher than its stored one.
                self._record(ids, per_example.detach().float().cpu())
        return (loss, outputs) if return_outputs else loss

    def _refreshes_store(self) -> bool:
        return self.args.sb_staleness > 1

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        if self.selector is not None:
            inputs = {k: v for k, v in inputs.items() if k != self.args.sb_index_column}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def evaluate(self, *args, **kwargs):
        if self.selector is None:
            return super().evaluate(*args, **kwargs)
        with self.stats.timer("eval_seconds"):
            return super().evaluate(*args, **kwargs)

    # ---- accounting -------------------------------------------------------------------------

    def selection_summary(self) -> dict:
        """Counters summed over processes plus derived figures (collective: call on every rank).

        ``optimizer_steps`` is not summed: every rank takes each step together (the same number
        on each), so examples backpropagated = optimizer_steps x batch x accumulation x processes.
        """
        state = self.stats.state_dict()
        totals = distributed.sum_over_processes(self.accelerator, {k: state[k] for k in COUNTERS})
        totals = {k: int(v) for k, v in totals.items()}
        totals["optimizer_steps"] = int(state["optimizer_steps"])
        totals.update({k: state[k] for k in TIMERS})
        wall = time.perf_counter() - getattr(self, "_train_start", time.perf_counter())
        return summarize(totals, wall)

    def log(self, logs, start_time=None):
        if self.selector is not None and ("loss" in logs or "train_runtime" in logs):
            summary = self.selection_summary()
            logs = {**logs, **{f"sb/{k}": v for k, v in summary.items()}}
        super().log(logs, start_time)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if self.selector is not None and resume_from_checkpoint is True:
            # transformers picks the highest checkpoint-N folder, even one a killed run left half
            # written; take the last one whose trainer_state.json (written last) and sb_state.pt exist.
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(
                    f"No complete checkpoint (with {TRAINER_STATE_NAME} and {STATE_FILE}) in {self.args.output_dir}"
                )
        output = super().train(resume_from_checkpoint, *args, **kwargs)
        if self.selector is not None:
            summary = self.selection_summary()
            summary["strategy"] = self.args.sb_strategy
            summary["expected_steps"] = self._expected_steps
            self.sb_stats = summary
            if self.args.should_save:
                os.makedirs(self.args.output_dir, exist_ok=True)
                with open(os.path.join(self.args.output_dir, STATS_FILE), "w") as handle:
                    json.dump(summary, handle, indent=2, sort_keys=True)
        return output

    def create_model_card(self, *args, **kwargs):
        # push_to_hub would replace the card that hf_selective_backprop.cards wrote (settings,
        # savings, accuracy) with the Trainer's generic one; keep ours when it is there.
        card = os.path.join(self.args.output_dir, "README.md")
        if os.path.isfile(card):
            with open(card, encoding="utf-8") as handle:
                if "selective-backprop" in handle.read():
                    return
        super().create_model_card(*args, **kwargs)

    # ---- checkpoints --------------------------------------------------------------------------

    def _save_checkpoint(self, model, trial):
        if self.selector is None:
            return super()._save_checkpoint(model, trial)
        with self.stats.timer("save_seconds"):
            # Selection state first: the Trainer writes trainer_state.json after the weights, optimizer
            # and RNG files and rotates old checkpoints only after that, so trainer_state.json marks a
            # complete checkpoint and a kill mid-save never leaves only incomplete ones (docs/reliability.md).
            folder = os.path.join(self._get_output_dir(trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            if self.args.should_save:
                atomic_save(self._shared_state(), os.path.join(folder, STATE_FILE))
            atomic_save(self._rank_state(), os.path.join(folder, RANK_STATE_FILE.format(rank=self.args.process_index)))
            if self.accelerator.num_processes > 1:
                self.accelerator.wait_for_everyone()
            super()._save_checkpoint(model, trial)

    def _shared_state(self) -> dict:
        """State that is identical on every rank: saved once."""
        return {
            "selector": self.selector.state_dict(),
            "store": self.store.state_dict(),
            "epoch": self._epoch,
            "consumed": self._consumed,
            "world_size": self.accelerator.num_processes,
        }

    def _rank_state(self) -> dict:
        return {
            "generator": self.generator.get_state(),
            "queue": self.queue.state_dict(),
            "stats": self.stats.state_dict(),
            # Per rank too: a 'local' history scope (or kath18's running tau) differs between ranks.
            "selector": self.selector.state_dict(),
        }

    def _load_selection_state(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{checkpoint} has no {STATE_FILE}: it was not written by SelectiveBackpropTrainer, so the "
                "selection state (loss history, per-example store, position in the epoch) cannot be restored. "
                "Resume it with transformers.Trainer, or start a new run from its weights."
            )
        shared = torch.load(path, weights_only=False)
        self.selector.load_state_dict(shared["selector"])
        self.store.load_state_dict(shared["store"])
        self._epoch, self._skip_on_resume = shared["epoch"], shared["consumed"]
        self._resume_checkpoint = checkpoint
        rank_path = os.path.join(checkpoint, RANK_STATE_FILE.format(rank=self.args.process_index))
        if shared["world_size"] == self.accelerator.num_processes and not os.path.isfile(rank_path):
            raise FileNotFoundError(
                f"{checkpoint} has no {os.path.basename(rank_path)}: this process's queue, generator and counters "
                "cannot be restored, so the resumed run would not continue the saved one"
            )
        if shared["world_size"] == self.accelerator.num_processes:
            rank = torch.load(rank_path, weights_only=False)
            self.generator.set_state(rank["generator"])
            self.queue.clear()
            self._push_saved_queue(rank["queue"])
            self.stats.load_state_dict(rank["stats"])
            if "selector" in rank:
                self.selector.load_state_dict(rank["selector"])
        else:
            self._adopt_rank_states(checkpoint, shared["world_size"])

    def _push_saved_queue(self, state: dict) -> None:
        # Saved rows are on the CPU; new rows arrive on the device, and a popped batch may join both.
        self.queue.push({key: value.to(self.args.device) for key, value in state["rows"].items()})

    def _adopt_rank_states(self, checkpoint: str, old_world: int) -> None:
        """Resume with another number of processes than the checkpoint was saved by.

        Every rank reads the same number of selection batches, dealt in turn from one shuffled
        order that does not depend on the number of processes: ``consumed`` batches per old rank
        are ``consumed * old_world`` batches of that order, so each new rank skips
        ``floor(consumed * old_world / world)`` (rounding down re-reads at most one batch per
        rank instead of skipping unread ones). Old rank r's queued rows and counters go to new
        rank ``r % world``; new rank r continues old rank r's generator and selector state.
        """
        world, rank = self.accelerator.num_processes, self.args.process_index
        self._skip_on_resume = self._skip_on_resume * old_world // world
        adopted = []
        for old_rank in range(rank, old_world, world):
            path = os.path.join(checkpoint, RANK_STATE_FILE.format(rank=old_rank))
            if os.path.isfile(path):
                adopted.append((old_rank, torch.load(path, weights_only=False)))
        self.queue.clear()
        for old_rank, state in adopted:
            self._push_saved_queue(state["queue"])
            if old_rank == rank:
                self.generator.set_state(state["generator"])
                if "selector" in state:
                    self.selector.load_state_dict(state["selector"])
        if adopted:
            merged = {name: 0 for name in COUNTERS}
            for _, state in adopted:
                for name in COUNTERS:
                    merged[name] += state["stats"].get(name, 0)
            # A step is taken by all ranks together; times are per process.
            merged["optimizer_steps"] = max(state["stats"].get("optimizer_steps", 0) for _, state in adopted)
            for name in TIMERS:
                merged[name] = max(state["stats"].get(name, 0.0) for _, state in adopted)
            self.stats.load_state_dict(merged)
        warnings.warn(
            f"{checkpoint} was saved by {old_world} processes and this run has {world}: the shared loss "
            f"history and store are restored; this process takes over the queued rows and counters of old "
            f"rank(s) {[old for old, _ in adopted]} and skips {self._skip_on_resume} selection batches of the "
            "resumed epoch. The run continues, but not bit for bit as it would have with the same processes.",
            stacklevel=2,
        )


def _lambda_at_progress(fn, trainer: SelectiveBackpropTrainer, total_steps: int, step: int) -> float:
    if not trainer._epoch_based:
        return fn(step)
    return fn(round(trainer.training_progress() * total_steps))


def _column_values(dataset: HFDataset, column: str) -> numpy.ndarray:
    """A datasets.Dataset column as a NumPy array, fast: the Arrow column, then the row mapping that
    select/shuffle/filter leave (reading through the dataset's formatting takes minutes for 1M rows)."""
    values = dataset.data.column(column).to_numpy()
    mapping = getattr(dataset, "_indices", None)
    return values if mapping is None else values[mapping.column(0).to_numpy()]


def _batch_length(batch: dict) -> int:
    return next(iter(batch.values())).shape[0]


def _batch_device(batch: dict) -> torch.device:
    return next(iter(batch.values())).device
