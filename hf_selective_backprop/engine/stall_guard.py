"""A warning when selection holds a classifier at chance, the stall measured fine-tuning a text classifier.

Fine-tuning a BERT with a new 2-way head on SST-2 (docs/benchmarks/benchmarks.md), SB at keep 1/3 and top-k at keep
1/2 kept a validation loss of ln 2 (answers a hair from 50/50) at every evaluation of every seed: each step trains
on what the current model gets wrong, which pulls every answer back towards chance, and the next selection follows
the model. Nothing in the counters shows it, and the run goes on to its end. `StallGuard` watches a classifier's
losses for that signature while a strategy ranks by the current model's loss, and warns once.

A loss at chance alone does not tell that stall from a model that learns nothing at these settings (a plain run
stays at chance too). What does: the stalled runs' answers leaned the right way more often than any answer blind
to the inputs can (SST-2: 60-72 % of the evaluation set right at the end, at a 50/50 loss; its most common label 51 %).
`AnswerTally` counts that on the rows selection scores, so the guard warns only when the model reads its inputs.
"""

from __future__ import annotations

import logging
import math
import warnings

import torch
from transformers import TrainerCallback

from ..losses import model_task

logger = logging.getLogger(__name__)

#: How close to ln(K) a mean loss must be to read as a uniform answer (the SST-2 stall sat within 0.1 % of ln 2).
CHANCE_TOLERANCE = 0.01
#: The share of the run's steps an unbroken stretch of such losses must cover before the guard warns: every run
#: with a new head starts at chance, and a learning one leaves it early (Traditional on SST-2 answered 80 % right
#: after a quarter of its first epoch).
STALL_SHARE = 0.25
#: The fewest observations (training logs and evaluations) in that stretch.
STALL_OBSERVATIONS = 3
#: How many standard errors above 1/K the balanced accuracy of the answers must be to show the model reads its inputs
#: (`AnswerTally`).
ABOVE_CHANCE_ERRORS = 3
#: The fewest scored rows before the tally decides either way.
TALLY_ROWS = 256


class SelectionStallWarning(UserWarning):
    """Selection holds the model at chance (`StallGuard`)."""


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


class AnswerTally:
    """Per label, how many of a classifier's selection forwards' rows carry it and how many of those were answered
    right (the gold logit above every other). Counted on the device; read once per observation.

    Their balanced accuracy (the mean over labels of the share answered right) tells whether the answers read the
    inputs: an answer blind to them names label c at some rate q_c whatever the row, so each label's rows are right
    at that rate and the mean over labels is 1/K, whatever the label frequencies."""

    def __init__(self, labels: int):
        self.labels = labels
        self.fed = False  # whether any batch had margins (a custom loss may define none)
        self.reset()

    def reset(self) -> None:
        self._counts: torch.Tensor | None = None  # [rows per label, right answers per label]

    def add(self, margins: torch.Tensor, labels: torch.Tensor) -> None:
        """A scored batch's margins (`ExampleLoss.margins`: NaN for an ignored row) and class labels."""
        # Fixed-size sums, not bincount or a boolean index: those size their output from the data, a wait for
        # the device at every step. An ignored row (-100) is summed with weight 0.
        labels = labels.reshape(-1).long().clamp(0, self.labels - 1).to(margins.device)
        answered, right = ~torch.isnan(margins), margins > 0  # NaN > 0 is False
        counts = torch.zeros(2, self.labels, dtype=torch.long, device=margins.device)
        counts[0].index_add_(0, labels, answered.long())
        counts[1].index_add_(0, labels, right.long())
        self._counts = counts if self._counts is None else self._counts + counts
        self.fed = True

    def reads_inputs(self) -> tuple[bool, float] | None:
        """(whether the balanced accuracy since the last reset is above 1/K by more than `ABOVE_CHANCE_ERRORS`
        standard errors of an input-blind answer, that balanced accuracy); None until `TALLY_ROWS` rows."""
        if self._counts is None:
            return None
        rows, right = self._counts.tolist()
        if sum(rows) < TALLY_ROWS:
            return None
        seen = [(n, r) for n, r in zip(rows, right, strict=True) if n > 0]
        balanced = sum(r / n for n, r in seen) / len(seen)
        # An input-blind answer's per-label shares are independent binomials of variance q(1 - q) / n <= 1 / (4n).
        error = math.sqrt(sum(1 / (4 * n) for n, _ in seen)) / len(seen)
        return balanced > 1 / len(seen) + ABOVE_CHANCE_ERRORS * error, balanced


class StallGuard(TrainerCallback):
    """Watches a classifier's training loss (the kept rows') and evaluation loss while selection runs. When they
    stay at ln(K) over `STALL_SHARE` of the run: a `SelectionStallWarning` if its answers read the inputs
    (`AnswerTally`), the stall's signature; else one logged line that names the control which tells the two apart,
    since a model that learns nothing at these settings looks the same from inside the run."""

    def __init__(self, trainer, labels: int):
        self.trainer = trainer
        self.labels = labels
        self.chance = math.log(labels)  # the cross-entropy of a uniform answer
        self.warned = False
        self.noted = False  # the line for answers blind to the inputs
        self.answers = AnswerTally(labels)
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
        self.answers.reset()

    def on_train_begin(self, args, state, control, **kwargs):
        # The counters and step are a checkpoint's on resume; each loop has its own engine to tally for.
        self._start(self.trainer.engine.stats.considered, state.global_step)
        self.trainer.engine.loss_source.answers = self.answers

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
            self.answers.reset()
        else:
            if self._stretch_start is None:
                self._stretch_start = self._last_step  # a logged loss is the mean over the steps since the last log
            self._observations += 1
        self._considered, self._last_step = considered, state.global_step
        if not at_chance or self.warned or self._observations < STALL_OBSERVATIONS:
            return
        covered = (state.global_step - self._stretch_start) / max(state.max_steps, 1)
        answers = self.answers.reads_inputs()
        if covered < STALL_SHARE or (self.answers.fed and answers is None):  # too soon, or too few rows to tell
            return
        stalled = (f"the {what} has stayed at ln({self.labels}) = {self.chance:.3f}, the loss of a uniform answer, "
                   f"for {covered:.0%} of the run while --sb_strategy {args.sb_strategy} ranked by the model's loss")
        if answers is not None and answers[0]:
            self.warned = True
            if args.should_log:
                warnings.warn(self._stall_message(stalled, answers[1]), SelectionStallWarning, stacklevel=2)
        elif not self.noted:
            self.noted = True
            if args.should_log:
                logger.warning(self._blind_message(stalled, answers))

    def _stall_message(self, stalled: str, balanced: float) -> str:
        return (
            f"selection holds the model at chance: {stalled}, yet its answers read the inputs (their balanced "
            f"accuracy on the rows it scored is {balanced:.0%}, where an answer blind to them scores "
            f"1/{self.labels}). Fine-tuning a text classifier with a new head (SST-2), SB at keep 1/3 and top-k at "
            "keep 1/2 stalled this way at a 50/50 answer and ended 9-17 points below a random subset of their "
            "size: training on what the model now gets wrong pulls its answers back to chance (docs/results.md). "
            "Use --sb_strategy infobatch (the default; it kept plain training's accuracy there), or a full first "
            "epoch (--sb_warmup_epochs 1), and compare with --sb_strategy uniform at the same --sb_keep and with "
            "--sb_strategy none"
        )

    def _blind_message(self, stalled: str, answers: tuple[bool, float] | None) -> str:
        seen = ("its answers could not be counted (the loss defines no margins)" if answers is None else
                f"its answers are blind to the inputs (balanced accuracy {answers[1]:.0%}, chance 1/{self.labels})")
        return (
            f"the model has not left chance: {stalled}, and {seen}. This run alone cannot tell a model that learns "
            "nothing at these settings from one that selection holds at chance; a short --sb_strategy none run "
            "with the same settings can: if it stays at chance too, change the learning rate or model, not the "
            "strategy; if it learns, use --sb_strategy infobatch or --sb_warmup_epochs 1"
        )
