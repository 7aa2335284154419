"""Train, evaluate, save and card one image classifier: what `scripts/train.py` runs."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sized
from dataclasses import dataclass, field
from pathlib import Path

from accelerate import PartialState
from transformers import set_seed
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

from .cards import hub_dataset_id, training_costs
from .config import SelectiveBackpropConfig
from .data import DataArguments, load_image_data
from .engine import run_signature
from .engine.checkpoints import (
    STATE_FILE,
    last_complete_checkpoint,
    require_intact_selection_state,
    require_resumable,
)
from .metrics import compute_metrics
from .models import ModelArguments, build_model, model_flags, pretrained_statistics
from .output_lock import LOCK_FILE, claimed
from .trainer import SelectiveBackpropTrainer

logger = logging.getLogger(__name__)
#: The ids --holdout_fraction set aside, written into --output_dir.
HOLDOUT_FILE = "holdout.json"
#: scripts/train.py's defaults: the paper's CIFAR-10 recipe where a CPU run allows them (every one is a flag). Code
#: that trains as that script does (cross-validation folds beside its run) starts from these too.
IMAGE_TRAINING_DEFAULTS = dict(
    per_device_train_batch_size=128,
    per_device_eval_batch_size=256,
    learning_rate=0.1,
    weight_decay=5e-4,
    optim="sgd",
    optim_args="momentum=0.9",
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=2,
    logging_steps=20,
    report_to="none",
    remove_unused_columns=True,
)

#: scripts/train_text.py's defaults: a small BERT trained from scratch (every one is a flag). Code that trains as
#: that script does (compare.py's text runs, cross-validation folds beside its run) starts from these too.
TEXT_TRAINING_DEFAULTS = dict(
    num_train_epochs=1,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=128,
    learning_rate=1e-3,
    weight_decay=0.01,
    warmup_steps=0.06,
    eval_strategy="epoch",
    save_strategy="epoch",
    save_total_limit=1,
    logging_steps=100,
    report_to="none",
)


@dataclass
class RunResult:
    """What one run produced: final metrics, cost counters and where it was saved."""

    strategy: str
    accuracy: float | None
    stats: dict
    output_dir: str
    eval_history: list[dict] = field(default_factory=list)


#: Files of a finished run at the top of its output folder: the saved model.
FINISHED_RUN_FILES = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)


@dataclass
class OutputArguments:
    """What a script may do with an --output_dir that already holds files.

    transformers 5 dropped ``TrainingArguments.overwrite_output_dir``; the Hugging Face example
    scripts offered the flag themselves and refused a non-empty folder without it or a resume.
    """

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into an --output_dir that already holds files (a finished run, an earlier run's "
            "checkpoints, anything else): files the run writes replace those of the same name; checkpoint "
            "folders it did not write are never deleted. Without it such a folder is refused before anything "
            "is read or written, unless --resume_from_checkpoint continues the run saved in it."
        },
    )


def save_results(trainer, train_metrics: dict | None, eval_metrics: dict | None) -> None:
    """End a run as the Hugging Face example scripts do: each split's metrics printed (``trainer.log_metrics``) and
    written to ``train_results.json`` / ``eval_results.json`` (``trainer.save_metrics``, which also merges them into
    ``all_results.json``), then ``trainer_state.json`` (``trainer.save_state``: the log history and steps).

    ``eval_metrics`` is None for a run without an evaluation split: no ``eval_results.json`` then. The number of
    rows is added as ``train_samples`` / ``eval_samples`` where the dataset has a length (not on a stream, nor for
    a dict of evaluation sets). Every process calls this; the main process alone prints and writes, as the Trainer's
    own methods decide.
    """
    for split, metrics, dataset in (("train", train_metrics, trainer.train_dataset),
                                    ("eval", eval_metrics, trainer.eval_dataset)):
        if metrics is None:
            continue
        metrics = dict(metrics)
        if f"{split}_samples" not in metrics and isinstance(dataset, Sized) and not isinstance(dataset, dict):
            metrics[f"{split}_samples"] = len(dataset)
        trainer.log_metrics(split, metrics)
        trainer.save_metrics(split, metrics)
    trainer.save_state()


def write_holdout(data_args: DataArguments, holdout_ids, path: str) -> None:
    """Which rows were held out and which side the run trained on: enough to redraw the split and check it."""
    record = {
        "holdout_fraction": data_args.holdout_fraction,
        "holdout_seed": data_args.holdout_seed,
        "train_on": data_args.train_on,
        "max_train_samples": data_args.max_train_samples,
        "holdout_ids": holdout_ids.tolist(),
    }
    with open(path, "w") as handle:
        json.dump(record, handle)


def check_output_dir(path: str) -> None:
    """Fail if ``path`` cannot become the run's output folder; nothing is created or changed here."""
    target = Path(path).expanduser().absolute()
    if target.exists() and not target.is_dir():
        raise ValueError(f"--output_dir {path!r} is a file, not a folder; choose another --output_dir")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"--output_dir {path!r} cannot be created: {existing} is a file, not a folder; choose another --output_dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        where = " is" if existing == target else f": its parent {existing} is"
        raise ValueError(f"--output_dir {path!r}{where} not writable by this user; choose a writable --output_dir")


def check_output_dir_is_free(
    path: str, resume_from: str | None = None, overwrite: bool = False, resumable: bool = True
) -> None:
    """Refuse an output folder that holds files (a finished run, checkpoints, anything else) before anything is
    written, unless ``overwrite`` or the run resumes from a checkpoint inside it (``resume_from``, as
    `resume_checkpoint` returns it), as the Hugging Face example scripts did. Every process calls this; a script
    without --resume_from_checkpoint passes ``resumable=False``, so that the refusal names no such flag."""
    target = Path(path).expanduser().absolute()
    resuming_here = resume_from is not None and Path(resume_from).expanduser().absolute().parent == target
    entries = sorted(os.listdir(target)) if target.is_dir() and not (overwrite or resuming_here) else []
    entries = [name for name in entries if name != LOCK_FILE]  # a live run's is refused by `output_lock.claimed`
    # Every process looks before any writes: the main process must not fill the folder before another looks.
    PartialState().wait_for_everyone()
    if entries:
        _refuse_a_folder_in_use(path, entries, resume_from, resumable)


def _refuse_a_folder_in_use(path: str, entries: list[str], resume_from: str | None, resumable: bool) -> None:
    checkpoints = sorted(
        (name for name in entries if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-")), key=lambda name: (len(name), name)
    )
    model = [name for name in entries if name in FINISHED_RUN_FILES]
    others = [name for name in entries if name not in checkpoints and name not in model]
    held = []
    if model:
        held.append(f"a finished run ({', '.join(model)})")
    if checkpoints:
        held.append(f"checkpoints ({_listed(checkpoints)})")
    if others:
        held.append(f"{'other files' if held else 'files'} ({_listed(others)})")
    resume = ""
    if checkpoints and not model and resume_from is None and resumable:
        resume = "--resume_from_checkpoint True to continue the run saved there, "
    raise ValueError(
        f"--output_dir {path!r} already holds {' and '.join(held)}, which a new run would overwrite. Pass {resume}"
        "--overwrite_output_dir to train into it anyway (files of the same name are replaced; checkpoint folders "
        "the new run did not write are never deleted), or choose another --output_dir"
    )


def _listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")


def resume_checkpoint(config: SelectiveBackpropConfig) -> str | None:
    """The checkpoint folder ``--resume_from_checkpoint`` names, checked; None to start afresh.

    ``True`` or ``last`` (a command line can only pass strings) take the last complete checkpoint
    in ``--output_dir``, as ``SelectiveBackpropTrainer.train(resume_from_checkpoint=True)`` does. ``config`` may
    be plain `TrainingArguments` (scripts/pretrain_lm.py): a run without selection.
    """
    value = config.resume_from_checkpoint
    if value is None:
        return None
    selective = getattr(config, "sb_strategy", "none") != "none"
    flag = f"--resume_from_checkpoint {value!r}"
    if str(value).strip().lower() in ("true", "last"):
        # The trainer's own choice for True: the last checkpoint with selection state for a selective
        # run, transformers' highest checkpoint-N otherwise (plain runs save no selection state).
        if selective:
            found = last_complete_checkpoint(config.output_dir)
        else:
            found = get_last_checkpoint(config.output_dir) if os.path.isdir(config.output_dir) else None
        if found is None:
            needs = f"{TRAINER_STATE_NAME} and {STATE_FILE}" if selective else TRAINER_STATE_NAME
            raise ValueError(
                f"{flag}: no complete checkpoint (a {PREFIX_CHECKPOINT_DIR}-N folder with {needs}) in "
                f"--output_dir {config.output_dir!r}; drop the flag to start a new run, or pass a checkpoint folder"
            )
        value = found
    _check_checkpoint(str(value), flag, selective)
    if not selective:  # a selective run's checkpoint, or another budget: refused before any data is read
        run_signature.check_without_selection(str(value), config)
    logger.info("resuming from %s", value)
    return str(value)


def _check_checkpoint(folder: str, flag: str, selective: bool) -> None:
    if not os.path.isdir(folder):
        raise ValueError(
            f"{flag}: no such folder; pass a {PREFIX_CHECKPOINT_DIR}-N folder of an earlier run, or True (or last) "
            "for the last complete checkpoint in --output_dir"
        )
    # First: a selective run's checkpoint without its sb_state.pt is damaged, not one to resume without selection.
    require_intact_selection_state(folder, "--resume_from_checkpoint")
    required = (TRAINER_STATE_NAME, STATE_FILE) if selective else (TRAINER_STATE_NAME,)
    missing = [name for name in required if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        inside = sorted(
            (name for name in os.listdir(folder) if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-")),
            key=lambda name: (len(name), name),  # checkpoint-500 before checkpoint-1000
        )
        if inside:
            hint = f"it holds {', '.join(inside)}: pass one of them, or True for the last complete one"
        elif missing == [STATE_FILE]:
            hint = (
                "it was saved by a run without selection (--sb_strategy none or transformers.Trainer): "
                "resume it with --sb_strategy none"
            )
        else:
            hint = f"pass a {PREFIX_CHECKPOINT_DIR}-N folder of an earlier run"
        raise ValueError(f"{flag} is not a complete checkpoint: it lacks {', '.join(missing)}; {hint}")
    try:
        with open(os.path.join(folder, TRAINER_STATE_NAME)) as handle:
            json.load(handle)
    except ValueError as error:
        raise ValueError(
            f"{flag}: its {TRAINER_STATE_NAME} is not valid JSON (a save cut short?): pass an earlier checkpoint, "
            "or True for the last complete one"
        ) from error
    require_resumable(folder, "--resume_from_checkpoint")


def train_image_classifier(
    config: SelectiveBackpropConfig,
    data_args: DataArguments,
    model_args: ModelArguments,
    overwrite_output_dir: bool = False,
) -> RunResult:
    """Train, evaluate, save and card; ``overwrite_output_dir`` as `OutputArguments` says."""
    # These checks are cheap; none of these mistakes should cost a decode of the dataset first.
    check_output_dir(config.output_dir)
    checkpoint = resume_checkpoint(config)
    run_signature.check_model_flags(checkpoint, model_flags(model_args))
    check_output_dir_is_free(config.output_dir, checkpoint, overwrite_output_dir)
    if data_args.eval_split is None and config.eval_strategy != "no":
        raise ValueError(
            f"--eval_split none leaves nothing to evaluate, but --eval_strategy is {config.eval_strategy.value!r}; "
            "add --eval_strategy no, or name an --eval_split"
        )
    with claimed(config.output_dir):
        return _train(config, data_args, model_args, checkpoint)


def _train(config: SelectiveBackpropConfig, data_args: DataArguments, model_args: ModelArguments,
           checkpoint: str | None) -> RunResult:
    set_seed(config.seed)
    data = load_image_data(data_args, seed=config.seed, index_column=config.sb_index_column,
                           statistics=pretrained_statistics(model_args))
    model = build_model(
        model_args, data.num_labels, data.image_size, data.mean, data.std, data.num_channels, data.label_names
    )
    trainer = SelectiveBackpropTrainer(
        model=model,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        compute_metrics=compute_metrics,
    )
    trainer.model_flags = model_flags(model_args)
    train_output = trainer.train(resume_from_checkpoint=checkpoint)
    stats = training_costs(trainer)

    metrics = trainer.evaluate() if data.eval is not None else None
    accuracy = (metrics or {}).get("eval_accuracy")
    trainer.save_model()
    # train_results.json (the benchmarks read a reference's cost from it), eval_results.json, all_results.json and
    # trainer_state.json, as the Hugging Face example scripts end.
    save_results(trainer, train_output.metrics, metrics)
    card = {"dataset": data.dataset_id, "eval_split": data_args.eval_split or "test"}
    if trainer.args.should_save:
        trainer.create_model_card(**card)
        if len(data.train.noisy_indices):
            data.train.noisy_indices.numpy().tofile(os.path.join(config.output_dir, "noisy_indices.int64"))
        if data.holdout_ids is not None:
            write_holdout(data_args, data.holdout_ids, os.path.join(config.output_dir, HOLDOUT_FILE))
    if config.push_to_hub:
        name = hub_dataset_id(data.dataset_id) or data.spec.name
        trainer.push_to_hub(commit_message=f"{config.sb_strategy} on {name}", **card)
    evals = [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]
    return RunResult(config.sb_strategy, accuracy, stats, config.output_dir, evals)
