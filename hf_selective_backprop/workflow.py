"""Train, evaluate, save and card one image classifier: what `scripts/train.py` runs."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from transformers import set_seed
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .accounting import STATS_FILE, write_stats
from .cards import hub_dataset_id, training_costs
from .checkpoints import STATE_FILE, last_complete_checkpoint
from .config import SelectiveBackpropConfig
from .data import DataArguments, load_image_data
from .metrics import compute_metrics
from .models import ModelArguments, build_model
from .trainer import SelectiveBackpropTrainer

logger = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What one run produced: final metrics, cost counters and where it was saved."""

    strategy: str
    accuracy: float | None
    stats: dict
    output_dir: str
    eval_history: list[dict] = field(default_factory=list)


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


def resume_checkpoint(config: SelectiveBackpropConfig) -> str | None:
    """The checkpoint folder ``--resume_from_checkpoint`` names, checked; None to start afresh.

    ``True`` or ``last`` (a command line can only pass strings) take the last complete checkpoint
    in ``--output_dir``, as ``SelectiveBackpropTrainer.train(resume_from_checkpoint=True)`` does.
    """
    value = config.resume_from_checkpoint
    if value is None:
        return None
    selective = config.sb_strategy != "none"
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
    logger.info("resuming from %s", value)
    return str(value)


def _check_checkpoint(folder: str, flag: str, selective: bool) -> None:
    if not os.path.isdir(folder):
        raise ValueError(
            f"{flag}: no such folder; pass a {PREFIX_CHECKPOINT_DIR}-N folder of an earlier run, or True (or last) "
            "for the last complete checkpoint in --output_dir"
        )
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


def train_image_classifier(
    config: SelectiveBackpropConfig, data_args: DataArguments, model_args: ModelArguments
) -> RunResult:
    # These checks are cheap; none of these mistakes should cost a decode of the dataset first.
    check_output_dir(config.output_dir)
    checkpoint = resume_checkpoint(config)
    if data_args.eval_split is None and config.eval_strategy != "no":
        raise ValueError(
            f"--eval_split none leaves nothing to evaluate, but --eval_strategy is {config.eval_strategy.value!r}; "
            "add --eval_strategy no, or name an --eval_split"
        )
    set_seed(config.seed)
    data = load_image_data(data_args, seed=config.seed)
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
    trainer.train(resume_from_checkpoint=checkpoint)
    stats = training_costs(trainer)

    metrics = trainer.evaluate() if data.eval is not None else {}
    accuracy = metrics.get("eval_accuracy")
    trainer.save_model()
    card = {"dataset": data.dataset_id, "eval_split": data_args.eval_split or "test"}
    if trainer.args.should_save:
        trainer.create_model_card(**card)
        if config.sb_strategy == "none":  # the trainer writes it for selective runs; comparisons read it for all
            write_stats(stats, os.path.join(config.output_dir, STATS_FILE))
        if len(data.train.noisy_indices):
            data.train.noisy_indices.numpy().tofile(os.path.join(config.output_dir, "noisy_indices.int64"))
    if config.push_to_hub:
        name = hub_dataset_id(data.dataset_id) or data.spec.name
        trainer.push_to_hub(commit_message=f"{config.sb_strategy} on {name}", **card)
    evals = [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]
    return RunResult(config.sb_strategy, accuracy, stats, config.output_dir, evals)
