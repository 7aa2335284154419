"""What a selective trainer reads of a training step's loss: the weighted loss of a weighting strategy, each
trained example's loss for the store (fresher than the stored one) and for the example record, and, when a label
breaks the step, the example it belongs to."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .engine.scoring import naming_examples
from .engine.stall_guard import label_count
from .logged_loss import LoggedLoss
from .losses import (
    BadRowsError,
    NoPerExampleLoss,
    check_class_labels,
    example_margins,
    labels_already_read,
    weighted_loss_and_estimate,
)
from .selectors.class_budget import class_labels
from .step_extras import StepExtras


def set_up(trainer, per_example_loss_func) -> None:
    """The label column, the per-example loss (the user's, or the one matching the model's own), the step's extra
    columns (ids, weights) and the logged loss of ``trainer``."""
    trainer.label_name = trainer.label_names[0] if trainer.label_names else "labels"
    # The label smoother's factor: the Trainer drops it for multi-label classification.
    smoothing = trainer.label_smoother.epsilon if trainer.label_smoother is not None else 0.0
    trainer.per_example_loss_func = per_example_loss_func or trainer._automatic_per_example_loss(smoothing)
    trainer._step_extras = StepExtras(trainer.args.sb_index_column)
    trainer._logged_loss = LoggedLoss()


class StepReads(NamedTuple):
    """Who reads a training step's per-example losses besides its weights."""

    refresh: bool  # the engine's store (Stale-SB, a strategy that plans from stored losses)
    recorded: bool  # the example record


def step_reads(trainer, training: bool, labels, ids, weights) -> StepReads | None:
    """What reads this step's per-example losses; None where nothing does and the Trainer's own loss is the step's
    (outputs are then not asked for: TRL's SFTTrainer runs a second forward to return them)."""
    refresh = trainer.selector is not None and trainer.engine.records_training_losses and ids is not None
    keeper = trainer.record_keeper
    recorded = keeper is not None and training and keeper.accepts(ids)
    if not (training and labels is not None and (weights is not None or refresh or recorded)):
        return None
    return StepReads(refresh, recorded)


def read_step_losses(trainer, loss, outputs, labels, ids, weights, num_items_in_batch, reads: StepReads):
    """The step's loss (the weighted one where the strategy weights), its examples' losses given to the store and
    the record."""
    # The model's own loss has read these labels: checking them again would wait for the device every step.
    with labels_already_read(trainer.per_example_loss_func):
        if weights is None:
            try:
                with torch.no_grad():  # read, never differentiated: the step's gradients stay the Trainer's own
                    per_example = trainer.per_example_loss_func(outputs, labels)
            except NoPerExampleLoss as why:
                if trainer.selector is not None:
                    raise
                trainer.record_keeper.stop(str(why))  # only the record read them: the step goes on
                return loss
        else:
            loss, per_example, trainer._logged_loss.pending = weighted_loss_and_estimate(
                trainer.per_example_loss_func, outputs, labels, weights, num_items_in_batch)
            loss = loss * trainer.loss_scale_rule.factor(trainer, num_items_in_batch)
    if reads.refresh:
        engine = trainer.engine
        if engine.labels is not None:  # a strategy that budgets by class stores each example's label too
            flag = f"--sb_strategy {trainer.args.sb_strategy}"
            engine.observe(ids, per_example.detach(), labels=class_labels(labels, flag))
        else:
            engine.observe(ids, per_example.detach())
    if reads.recorded:
        epoch = trainer.engine.epoch if trainer.selector is not None else trainer.record_keeper.epoch
        with torch.no_grad():
            margins = example_margins(trainer.per_example_loss_func, outputs, labels)
        trainer.record_keeper.trained(ids, per_example, margins, epoch)
    return loss


def name_bad_labels(trainer, labels: torch.Tensor, ids: torch.Tensor | None) -> None:
    """Raise a ValueError naming the label column, the valid range and the examples' ids where a classifier's
    labels fall outside its classes (torch's own error, from inside cross-entropy, names none of them). Called only
    once a step has failed: checking every step first would wait for the device."""
    classes = label_count(trainer.accelerator.unwrap_model(trainer.model))
    if classes is None:
        return
    try:
        check_class_labels(labels, classes, trainer.label_name)
    except BadRowsError as bad:
        raise naming_examples(bad, ids, trainer.args.sb_index_column) from bad
