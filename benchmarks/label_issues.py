"""Label issues found by the example record of one training run, against cleanlab's confident learning on K-fold
cross-validated probabilities (K trainings), on the image workflow with known flipped labels.

    python benchmarks/label_issues.py --record RUN_FOLDER --output_dir OUT [scripts/train.py's data and model flags]

RUN_FOLDER is a `scripts/train.py --label_noise P` run (its example_record.parquet and noisy_indices.int64). The
cross-validation trains the same model with the same flags (--num_train_epochs, --learning_rate, ...) K times,
each on (K-1)/K of the training set, and predicts the held-out fold without augmentation. Both rankings are scored
against the flipped ids: precision at the true number of flips, recall of the flagged set, AUROC of the ranking,
and the training each took. Needs cleanlab (`pip install cleanlab`), installed for this benchmark only.
Writes OUT/label_issues.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy
import torch
from transformers import HfArgumentParser

from harness.provenance import provenance
from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer, record
from hf_selective_backprop.data import DataArguments, ImageTensorDataset, load_image_data
from hf_selective_backprop.models import ModelArguments, build_model
from hf_selective_backprop.workflow import IMAGE_TRAINING_DEFAULTS


def auroc(scores: numpy.ndarray, positives: numpy.ndarray) -> float:
    """The probability that a positive ranks above a negative (ties count half): Mann-Whitney's U over n+ n-."""
    order = numpy.argsort(scores, kind="stable")
    ranks = numpy.empty(len(scores))
    sorted_scores = scores[order]
    # Average ranks over ties.
    _, first, counts = numpy.unique(sorted_scores, return_index=True, return_counts=True)
    for start, count in zip(first, counts, strict=True):
        ranks[order[start:start + count]] = start + (count + 1) / 2
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def ranking_metrics(suspicion: numpy.ndarray, flagged: numpy.ndarray, flipped: numpy.ndarray) -> dict:
    """``suspicion``: higher = likelier mislabeled; ``flagged``: the method's own flagged set (bool)."""
    top = numpy.argsort(-suspicion, kind="stable")[: int(flipped.sum())]
    return {
        "precision_at_flips": float(flipped[top].mean()),
        "flagged": int(flagged.sum()),
        "precision_flagged": float(flipped[flagged].mean()) if flagged.any() else None,
        "recall_flagged": float(flagged[flipped].mean()),
        "auroc": auroc(suspicion, flipped),
    }


def cross_validated_probabilities(config, data_args, model_args, folds: int):
    """Out-of-sample class probabilities of every training row, from ``folds`` trainings; and their seconds."""
    data = load_image_data(data_args, seed=config.seed, index_column=config.sb_index_column)
    train = data.train
    count = len(train)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(config.seed))
    probabilities = numpy.zeros((count, data.num_labels))
    seconds = 0.0
    for fold in range(folds):
        held = order[fold::folds]
        kept = order[~torch.isin(order, held)]
        fold_train = ImageTensorDataset(train.images[kept], train.labels[kept], train.transform, train.index[kept])
        fold_held = ImageTensorDataset(train.images[held], train.labels[held], train.transform, train.index[held])
        model = build_model(model_args, data.num_labels, data.image_size, data.mean, data.std, data.num_channels,
                            data.label_names)
        fold_config = dataclasses.replace(config, output_dir=os.path.join(config.output_dir, f"fold{fold}"),
                                          sb_record=False, save_strategy="no", eval_strategy="no")
        trainer = SelectiveBackpropTrainer(model=model, args=fold_config, train_dataset=fold_train)
        start = time.perf_counter()
        trainer.train()
        seconds += time.perf_counter() - start
        logits = trainer.predict(fold_held.without_augmentation()).predictions
        probabilities[held.numpy()] = torch.softmax(torch.as_tensor(logits), -1).numpy()
        print(f"fold {fold}: trained on {len(kept)}, predicted {len(held)}", flush=True)
    return train, probabilities, seconds


def build_parser() -> HfArgumentParser:
    parser = HfArgumentParser((SelectiveBackpropConfig, DataArguments, ModelArguments))
    # The folds train as the record's run did: a bare TrainingArguments would give them batch 8 and AdamW.
    parser.set_defaults(**IMAGE_TRAINING_DEFAULTS)
    parser.add_argument("--record", required=True, help="the noisy run's output folder")
    parser.add_argument("--folds", type=int, default=5)
    return parser


def main() -> None:
    config, data_args, model_args, options = build_parser().parse_args_into_dataclasses()
    from cleanlab.filter import find_label_issues
    from cleanlab.rank import get_label_quality_scores

    train, probabilities, cv_seconds = cross_validated_probabilities(config, data_args, model_args, options.folds)
    ids = train.index.numpy()
    labels = train.labels.numpy()
    flipped_ids = numpy.fromfile(os.path.join(options.record, "noisy_indices.int64"), dtype=numpy.int64)
    flipped = numpy.isin(ids, flipped_ids)

    issues = find_label_issues(labels, probabilities)
    quality = get_label_quality_scores(labels, probabilities)
    cleanlab = ranking_metrics(-quality, issues, flipped)

    table = record.load_record(options.record)
    by_id = dict(zip(table[config.sb_index_column], range(len(table)), strict=True))
    rows = [by_id[int(i)] for i in ids]
    confidence = numpy.asarray(table["confidence"], dtype=float)[rows]
    hard = numpy.asarray([region == record.HARD for region in table["region"]])[rows]
    ours = ranking_metrics(-confidence, hard, flipped)
    with open(os.path.join(options.record, "train_results.json")) as handle:
        record_seconds = json.load(handle)["train_runtime"]

    result = {
        "provenance": provenance(), "examples": int(len(ids)), "flipped": int(flipped.sum()),
        "record": {**ours, "seconds": record_seconds, "trainings": 1},
        "cleanlab": {**cleanlab, "seconds": cv_seconds, "trainings": options.folds},
    }
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, "label_issues.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=2))


if __name__ == "__main__":
    main()
