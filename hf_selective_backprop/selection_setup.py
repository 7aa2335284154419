"""What a selective trainer sets up when it is built (the selector, selection's checks, data, engine and hooks), at
each training loop's start, and for the training loader.

Every check that can refuse the setup (``CannotSelect``: a trainer, model, dataset or launch selection does not
support) comes before anything is added to the Trainer, so that the default strategy, which steps aside on such a
setup (`default_strategy`), leaves the Trainer as it was: its callbacks, its loop, its data.
"""

from __future__ import annotations

import contextlib
import logging
import time

from transformers.trainer_utils import has_length

from . import _compat, default_strategy, parallelism
from .engine import budget, reference, rotation, run_signature, streams
from .engine.callback import SelectionFlowCallback
from .engine.data_state import DataState
from .engine.indexing import keeping_ids, prepare_training_dataset, unnamed_rows
from .engine.run_length import RunLength
from .engine.stall_guard import StallGuard, chance_loss, label_count
from .losses import model_task
from .record.keeper import RecordKeeper
from .selectors import build_selector
from .selectors.class_budget import refuse_token_labels

logger = logging.getLogger(__name__)


def with_default_arguments(trainer, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The constructor's arguments, with the trainer's `default_arguments` where ``args`` is not given (or None), as
    `Trainer` makes TrainingArguments(output_dir="tmp_trainer") when given none."""
    if (args[1] if len(args) > 1 else kwargs.get("args")) is not None:
        return args, kwargs
    default = trainer.default_arguments(args[0] if args else kwargs.get("model"))
    logger.info("No arguments passed, using %s(output_dir=%r).", type(default).__name__, default.output_dir)
    if len(args) > 1:
        return (args[0], default, *args[2:]), kwargs
    return args, {**kwargs, "args": default}


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


def start_loop(trainer, batch_size, trial, resume_from_checkpoint) -> None:
    """A training loop's start (each train() call, each auto_find_batch_size restart, each search trial): its own
    record and, where selection runs, an engine for its batch size and settings, and the irreducible losses."""
    if trainer._records:
        trainer.record_keeper = RecordKeeper(trainer.accelerator, trainer.args.sb_index_column, trainer.train_dataset,
                                             classes=label_count(trainer.accelerator.unwrap_model(trainer.model)))
    if trainer.selector is None:
        return
    _compat.adopt_loop_batch_size(trainer, batch_size)  # auto_find_batch_size: a restart's or a resumed run's
    batch_size_changed = trainer._engine_batch_size != _compat.train_batch_size(trainer)
    if trainer._loops_started or batch_size_changed or trial is not None:
        # An earlier loop's state, micro-batches of another size, or a search trial's settings: afresh.
        trainer.selector = build_selector(trainer.args)
        fit_selector_to_model(trainer)
        trainer.engine = trainer._build_engine()
    trainer.engine.record = trainer.record_keeper
    trainer._loops_started += 1
    trainer._resumed_from = resume_from_checkpoint
    trainer._train_start = time.perf_counter()
    if trainer._reference is not None:  # scored once (a collective), or restored with the checkpoint
        resuming = resume_from_checkpoint is not None
        trainer.engine.use_irreducible(trainer._reference.irreducible_losses(trainer, resuming))


def selection_loader(trainer, train_sampler):
    """The training loader of selection batches (training batches are assembled from them), its sampler made by
    ``train_sampler`` (the trainer's), attached to the engine with the data's random state and the run's signature."""
    dataset = trainer.train_dataset
    if dataset is not None and has_length(dataset) and len(dataset) == 0:
        raise ValueError("the training dataset is empty")
    trainer._planned_sampler = None  # set by the trainer's sampler hook while the loader is built
    args = trainer.args
    data_state = DataState.for_training(
        dataset, trainer.data_collator, args.dataloader_num_workers,
        trainer.accelerator.dataloader_config.dispatch_batches,
    )
    # Wrapped for the training loader only: evaluation batches are not read by the engine.
    collator = data_state.wrap(keeping_ids(trainer.data_collator, args.sb_index_column))
    with streams.own_share(trainer.accelerator, dataset):  # a stream split by rank: read as it is
        loader = _compat.dataloader(
            trainer, dataset, "Training", trainer._selection_batch_size(), train_sampler, collator
        )
    model = trainer.accelerator.unwrap_model(trainer.model)
    trainer.engine.attach(loader, trainer._planned_sampler, data_state,
                          run_signature.describe(args, dataset, model, trainer.model_flags))
    return loader


def loop_values(trainer, args, dataloader, values):
    """The Trainer's loop values for a selective run: its length from the data, the keep fraction expected and, for a
    budget run, the budget's plan."""
    values = _compat.training_values(values)
    trainer._run_length = RunLength.for_run(
        args, trainer.selector.expected_keep_fraction(), dataloader, values.num_examples,
        trainer.accelerator.num_processes, _compat.train_batch_size(trainer), trainer._selection_batch_size(),
    )
    return budget.loop_values(trainer.engine, args, trainer._run_length, values, dataloader, trainer._resumed_from)
