"""What a selective trainer sets up when it is built: the selector, selection's checks, data, engine and hooks.

Every check that can refuse the setup (``CannotSelect``: a trainer, model, dataset or launch selection does not
support) comes before anything is added to the Trainer, so that the default strategy, which steps aside on such a
setup (`default_strategy`), leaves the Trainer as it was: its callbacks, its loop, its data.
"""

from __future__ import annotations

import contextlib

from . import _compat, default_strategy, parallelism
from .engine import reference, rotation, streams
from .engine.callback import SelectionFlowCallback
from .engine.indexing import prepare_training_dataset, unnamed_rows
from .engine.stall_guard import StallGuard, chance_loss
from .losses import model_task
from .selectors import build_selector
from .selectors.class_budget import refuse_token_labels


def selector_before_data(trainer, given, train_dataset, per_example_loss_func):
    """The strategy's selector (None without selection), once what ``trainer`` refuses before the wrapped trainer
    prepares its data (which can take long) is checked: the default steps aside there instead."""
    selector = build_selector(given) if given is not None else None
    try:
        trainer._refuse_before_data(given, selector, per_example_loss_func)
        unnamed = unnamed_rows(train_dataset) if selector is not None else None
        if unnamed is not None:
            raise default_strategy.CannotSelect(f"--sb_strategy {given.sb_strategy} keys examples by id: {unnamed}")
    except default_strategy.CannotSelect as why:
        if not default_strategy.is_default(given):
            raise
        default_strategy.step_aside(given, str(why))
        return None
    return selector


@contextlib.contextmanager
def stepping_aside(trainer):
    """Within: a setup selection cannot run on is refused for a chosen strategy; the default steps aside, and
    ``trainer`` trains as Trainer does, the record included where it can."""
    try:
        yield
    except default_strategy.CannotSelect as why:
        if trainer.selector is None or not default_strategy.is_default(trainer.args):
            raise
        default_strategy.step_aside(trainer.args, str(why))
        trainer.selector, trainer.engine = None, None


def set_up_selection(trainer, reference_model, per_example_loss_func) -> None:
    """Selection's checks, data, engine and hooks on ``trainer``, the checks first."""
    parallelism.refuse_unsupported(trainer)
    if trainer.selector.produces_weights:
        trainer.loss_scale_rule.check(trainer)  # an upstream that scales otherwise fails here, not in the gradients
    if trainer.train_dataset is not None:
        streams.check_training_data(trainer.args, trainer.selector, trainer.train_dataset)  # ids, split, infobatch
        trainer.train_dataset = prepare_training_dataset(
            trainer.train_dataset, trainer.model, trainer.args, trainer.label_names
        )
    if trainer.selector.uses_reference_losses:
        trainer._reference, trainer.train_dataset = reference.Reference.resolve(
            trainer, reference_model, per_example_loss_func
        )
    if trainer.selector.uses_stored_labels:
        refuse_token_labels(model_task(trainer.accelerator.unwrap_model(trainer.model)),
                            f"--sb_strategy {trainer.args.sb_strategy}")
    fit_selector_to_model(trainer)
    trainer.engine = trainer._build_engine()
    if per_example_loss_func is None:
        trainer._check_automatic_loss()
    trainer.add_callback(rotation.RunCheckpoints())
    StallGuard.attach(trainer)  # warns once if selection holds a classifier at chance
    # In the default flow's place: an epoch-based run ends when its data does (engine/callback.py).
    trainer._flow_callback = SelectionFlowCallback(trainer)
    _compat.replace_default_flow(trainer, trainer._flow_callback)


def fit_selector_to_model(trainer) -> None:
    """What a strategy reads of the model: a ranking by early losses warns when they sit at chance."""
    if hasattr(trainer.selector, "chance_loss"):
        trainer.selector.chance_loss = chance_loss(trainer.accelerator.unwrap_model(trainer.model))
