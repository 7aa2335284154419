"""A warning when selection holds a classifier at chance, the stall measured fine-tuning a text classifier.

Fine-tuning a BERT with a new 2-way head on SST-2 (docs/benchmarks/benchmarks.md), SB at keep 1/3 and top-k at keep
1/2 kept a validation loss of ln 2 (answers a hair from 50/50) at every evaluation of every seed: each step trains
on what the current model gets wrong, which pulls every answer back towards chance, and the next selection follows
the model. Nothing in the counters shows it, and the run goes on to its end. `StallGuard` watches a classifier's
losses for that signature while a strategy ranks by the current model's loss, and warns once.
"""

from __future__ import annotations

import math
import warnings

from transformers import TrainerCallback

from ..losses import model_task

#: How close to ln(K) a mean loss must be to read as a uniform answer (the SST-2 stall sat within 0.1 % of ln 2).
CHANCE_TOLERANCE = 0.01
#: The share of the run's steps an unbroken stretch of such losses must cover before the guard warns: every run
#: with a new head starts at chance, and a learning one leaves it early (Traditional on SST-2 answered 80 % right
#: after a quarter of its first epoch).
STALL_SHARE = 0.25
#: The fewest observations (training logs and evaluations) in that stretch.
STALL_OBSERVATIONS = 3


class SelectionStallWarning(UserWarning):
    """Selection seems to hold the model at chance (`StallGuard`)."""


def label_count(model) -> int | None:
    """K, the labels of a single-label classifier whose config names them; None for any other model."""
    config = getattr(model, "config", None)
    labels = getattr(config, "num_labels", None)
    if model_task(model) != "classification" or not isinstance(labels, int) or labels < 2:
        return None
    if getattr(config, "problem_type", None) in ("regression", "multi_label_classification"):
        return None
    return labels


def chance_loss(model) -> float | None:
    """ln(K), the cross-entropy of a K-class classifier's answer at chance; None for any other model."""
    labels = label_count(model)
    return None if labels is None else math.log(labels)


class StallGuard(TrainerCallback):
    """Warns once when a classifier's training loss (the kept rows') and evaluation loss stay at ln(K) over
    `STALL_SHARE` of the run while selection runs."""

    def __init__(self, trainer, labels: int):
        self.trainer = trainer
        self.labels = labels
        self.chance = math.log(labels)  # the cross-entropy of a uniform answer
        self.warned = False
        self._start(considered=0, step=0)

    @classmethod
    def attach(cls, trainer) -> None:
        """Watch ``trainer``'s runs when its strategy ranks rows by the current model's loss (the selection
        forward's) and its model is a classifier: the case that stalled. InfoBatch and uniform do not rank so."""
        labels = label_count(trainer.accelerator.unwrap_model(trainer.model))
        if trainer.selector.needs_losses and labels is not None:
            trainer.add_callback(cls(trainer, labels))

    def _start(self, considered: int, step: int) -> None:
        self._considered, self._last_step = considered, step
        self._selecting = False
        self._stretch_start: int | None = None
        self._observations = 0

    def on_train_begin(self, args, state, control, **kwargs):
        # The counters and step are a checkpoint's on resume.
        self._start(self.trainer.engine.stats.considered, state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self._observe(logs["loss"], "training loss of the rows it kept", args, state)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics and self.trainer.is_in_train:  # not an evaluation before or after
            self._observe(metrics["eval_loss"], "evaluation loss", args, state)

    def _observe(self, loss: float, what: str, args, state) -> None:
        considered = self.trainer.engine.stats.considered
        if state.global_step != self._last_step:  # else (an evaluation right after a log) the same steps as before
            self._selecting = considered > self._considered
        at_chance = self._selecting and abs(loss - self.chance) <= CHANCE_TOLERANCE * self.chance
        if not at_chance:
            self._stretch_start, self._observations = None, 0
        else:
            if self._stretch_start is None:
                self._stretch_start = self._last_step  # a logged loss is the mean over the steps since the last log
            self._observations += 1
        self._considered, self._last_step = considered, state.global_step
        if not at_chance or self.warned or self._observations < STALL_OBSERVATIONS:
            return
        covered = (state.global_step - self._stretch_start) / max(state.max_steps, 1)
        if covered >= STALL_SHARE:
            self.warned = True
            if args.should_log:
                warnings.warn(self._message(what, covered, args.sb_strategy), SelectionStallWarning, stacklevel=2)

    def _message(self, what: str, share: float, strategy: str) -> str:
        return (
            f"the model has stayed at chance while selecting: the {what} has stayed at ln({self.labels}) = "
            f"{self.chance:.3f}, the loss of a uniform answer over {self.labels} labels, for {share:.0%} of the run "
            f"while --sb_strategy {strategy} selected by the current model's loss. Either selection holds it there, "
            "or the model does not learn this task at these settings at all (then --sb_strategy none stays at chance "
            "too: a learning rate or model to change, not the strategy). Fine-tuning a text classifier "
            "with a new head (SST-2), SB at keep 1/3 and top-k at keep 1/2 stalled this way at a 50/50 answer and "
            "ended 9-17 points below a random subset of their size: training on what the model now gets wrong pulls "
            "its answers back to chance (docs/results.md). Use --sb_strategy infobatch (the default; it kept "
            "Traditional's accuracy there), or a full first epoch (--sb_warmup_epochs 1), and compare with "
            "--sb_strategy uniform at the same --sb_keep and with --sb_strategy none"
        )
