"""The Trainer callback that starts each epoch's plan and keeps the Trainer's bookkeeping honest."""

from __future__ import annotations

from transformers import DefaultFlowCallback
from transformers.trainer_utils import IntervalStrategy, SaveStrategy


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

    def on_train_begin(self, args, state, control, **kwargs):
        self.ended_at_step = None

    def on_epoch_begin(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        engine.begin_epoch(engine.epoch, args.num_train_epochs, engine.epoch_based)

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        state.epoch = engine.epochs_read()
        if not engine.epoch_based:
            return super().on_step_end(args, state, control, **kwargs)
        # The default flow ends the run (stop, final save and evaluation) at max_steps: show it the
        # real end, a fractional num_train_epochs included, and never the estimate.
        expected = state.max_steps
        ends = engine.progress(state.global_step, expected) >= 1.0
        state.max_steps = state.global_step if ends else max(expected, state.global_step + 1)
        try:
            control = super().on_step_end(args, state, control, **kwargs)
        finally:
            state.max_steps = expected
        if ends:
            self.ended_at_step = state.global_step
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
        if engine.epoch_based and done and self.ended_at_step != state.global_step:
            # The data ran out after the last step, which could not know it was the last: its final
            # checkpoint and evaluation, where that step did not already make them.
            self.ended_at_step = state.global_step
            if args.save_strategy == SaveStrategy.STEPS and state.global_step % state.save_steps != 0:
                control.should_save = True
            if (
                args.eval_strategy == IntervalStrategy.STEPS
                and state.global_step % state.eval_steps != 0
                and args.eval_delay <= state.global_step
            ):
                control.should_evaluate = True
        return control
