"""Train, evaluate, save and card one image classifier: what `scripts/train.py` runs."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from transformers import set_seed

from .cards import render_model_card
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


def traditional_stats(trainer: SelectiveBackpropTrainer, num_examples: int, train_seconds: float) -> dict:
    """Cost counters of an `sb_strategy=none` run, which trains every example it reads."""
    epochs = trainer.state.epoch or 0.0
    rows = round(epochs * num_examples)
    return {
        "strategy": "none",
        "examples_seen": rows,
        "selection_forwards": 0,
        "training_forwards": rows,
        "backwards": rows,
        "optimizer_steps": trainer.state.global_step,
        "kept_fraction": 1.0,
        "train_seconds": train_seconds,
    }


def train_image_classifier(
    config: SelectiveBackpropConfig, data_args: DataArguments, model_args: ModelArguments
) -> RunResult:
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
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    train_seconds = time.perf_counter() - start
    stats = getattr(trainer, "sb_stats", None) or traditional_stats(trainer, len(data.train), train_seconds)

    metrics = trainer.evaluate() if data.eval is not None else {}
    accuracy = metrics.get("eval_accuracy")
    trainer.save_model()
    if trainer.args.should_save:
        render_model_card(
            config.output_dir,
            config,
            architecture=model_args.model,
            dataset=data.dataset_id,
            stats=stats,
            accuracy=accuracy,
            eval_split=data_args.eval_split or "test",
            num_train_examples=len(data.train),
        )
        if len(data.train.noisy_indices):
            data.train.noisy_indices.numpy().tofile(os.path.join(config.output_dir, "noisy_indices.int64"))
    if config.push_to_hub:
        trainer.push_to_hub(commit_message=f"{config.sb_strategy} on {data.dataset_id}")
    evals = [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]
    return RunResult(config.sb_strategy, accuracy, stats, config.output_dir, evals)
