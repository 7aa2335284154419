"""The Trainer callback that starts each epoch's plan and keeps the Trainer's bookkeeping honest."""

from __future__ import annotations

import logging

from transformers import DefaultFlowCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy

from .. import _compat

logger = logging.getLogger(__name__)
#: The Trainer's logger, and how its warning for an epoch that made no step begins: under selection such an
#: epoch kept too few rows for a step, which carry over, and training goes on (the warning says it stops).
TRAINER_LOGGER = "transformers.trainer"
EMPTY_EPOCH_WARNING = "There seems not to be a single sample in your epoch_iterator"


class _EmptyEpochWarningFilter(logging.Filter):
    def __init__(self, trainer):
        super().__init__()
        self.trainer = trainer

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.trainer.is_in_train and str(record.msg).startswith(EMPTY_EPOCH_WARNING))


class SelectionFlowCallback(DefaultFlowCallback):
    """The Trainer's default flow (logging, evaluation, checkpoints) for a selective run.

    It takes the place of `DefaultFlowCallback`. Epochs of a selective run read the data once but
    make a varying number of steps, so in an epoch-based run ``state.max_steps`` is only the
    expected step count: the run ends when its data does, and the final checkpoint and evaluation
    that the default flow makes at ``max_steps`` come at that real last step instead.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.ended_at_step: int | None = None  # the step that was told it ends the run
        self.carried_over_said = False
        self._warning_filter = _EmptyEpochWarningFilter(trainer)

    def on_train_begin(self, args, state, control, **kwargs):
        self.ended_at_step = None
        self.carried_over_said = False
        logging.getLogger(TRAINER_LOGGER).addFilter(self._warning_filter)

    def on_train_end(self, args, state, control, **kwargs):
        self.stop_filtering()

    def stop_filtering(self) -> None:
        """Take the filter off the Trainer's logger (also when training raised before its end)."""
        logging.getLogger(TRAINER_LOGGER).removeFilter(self._warning_filter)

    def on_epoch_begin(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        engine.begin_epoch(engine.epoch, args.num_train_epochs, engine.epoch_based)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.engine.fail_if_training_loss_was_nonfinite(state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        state.epoch = engine.epochs_read()
        if not engine.follows_progress:
            return super().on_step_end(args, state, control, **kwargs)
        # The default flow ends the run (stop, final save and evaluation) at max_steps: show it the
        # real end (a fractional num_train_epochs, or the budget spent), and never the estimate.
        expected = state.max_steps
        progress = engine.progress(state.global_step, expected)
        ends = progress >= 1.0
        state.max_steps = state.global_step if ends else max(expected, state.global_step + 1)
        try:
            control = super().on_step_end(args, state, control, **kwargs)
        finally:
            # An estimate the run has outlived (it kept more rows than expected) is raised to the steps taken:
            # the state's global_step never exceeds its max_steps, in the checkpoints saved after this step too.
            state.max_steps = max(expected, state.global_step)
        # The progress bar opened at the expected steps and keeps them, raised one step at a time once the run
        # outlives them, and ends at the steps taken. An estimate from the progress so far (the steps over the share
        # of the data read) moved the total back and forth: a selection batch is read before the steps it feeds.
        if ends:
            self.ended_at_step = state.global_step
            _compat.set_progress_total(self.trainer, state.global_step)
        else:
            _compat.set_progress_total(self.trainer, max(expected, state.global_step + 1))
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        state.epoch = engine.epochs_read()
        control = super().on_epoch_end(args, state, control, **kwargs)
        done = engine.progress(state.global_step, state.max_steps) >= 1.0
        if engine.epoch_without_step and not done:
            # An epoch whose kept rows all stayed queued made no step; the Trainer reads that as an
            # empty dataset and stops. The rows carry over, so training goes on.
            control.should_training_stop = False
            if not self.carried_over_said:
                self.carried_over_said = True
                logger.warning(
                    "epoch %d kept fewer rows than one optimizer step takes (%d): they stay queued and train in the "
                    "next epoch's steps, and training goes on (said once per run)",
                    engine.epoch, _compat.train_batch_size(self.trainer) * args.gradient_accumulation_steps,
                )
        if engine.follows_progress and done and self.ended_at_step != state.global_step:
            # The data ran out after the last step, which could not know it was the last: its final
            # checkpoint and evaluation, where that step did not already make them.
            self.ended_at_step = state.global_step
            _compat.set_progress_total(self.trainer, state.global_step)
            if args.save_strategy == SaveStrategy.STEPS and state.global_step % state.save_steps != 0:
                control.should_save = True
            if (
                args.eval_strategy == IntervalStrategy.STEPS
                and state.global_step % state.eval_steps != 0
                and args.eval_delay <= state.global_step
            ):
                control.should_evaluate = True
        return control
