"""The Trainer callback that starts each epoch's plan and keeps the Trainer's bookkeeping honest."""

from __future__ import annotations

from transformers import TrainerCallback


class SelectionFlowCallback(TrainerCallback):
    """Epochs of a selective run read the data once but make a varying number of steps."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        engine.begin_epoch(engine.epoch, args.num_train_epochs, engine.epoch_based)

    def on_step_end(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        state.epoch = engine.epochs_read()
        if engine.epoch_based:
            # max_steps holds the *expected* step count; an epoch-based run ends when its data
            # does (a fractional num_train_epochs included), not at the estimate.
            control.should_training_stop = engine.progress(state.global_step, state.max_steps) >= 1.0
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        # An epoch whose kept rows all stayed queued made no step; the Trainer reads that as
        # an empty dataset and stops. The rows carry over, so training goes on.
        engine = self.trainer.engine
        state.epoch = engine.epochs_read()
        if engine.epoch_without_step and engine.progress(state.global_step, state.max_steps) < 1.0:
            control.should_training_stop = False
        return control
