"""Label issues found by the example record of one training run, against cleanlab's confident learning on K-fold
cross-validated probabilities (K trainings), with known flipped labels.

    python benchmarks/label_issues.py --record RUN_FOLDER --output_dir OUT [the run's data, model and training flags]
    python benchmarks/label_issues.py --workload text --record RUN_FOLDER --output_dir OUT [scripts/train_text.py's]

RUN_FOLDER is a `scripts/train.py --label_noise P` run (--workload image, the default) or a
`scripts/train_text.py --label_noise P` run (--workload text): its example_record.parquet and noisy_indices.int64.
The cross-validation trains the same model with the same flags (--num_train_epochs, --learning_rate, ...) K times,
each on (K-1)/K of the training set, and predicts the held-out fold (images without augmentation). Both rankings
are scored against the flipped ids: precision at the true number of flips, recall of the flagged set, AUROC of the
ranking, and the training each took; and for each ranking, the set `record.label_issues` flags (its size estimated
per class from the record, as confident learning does): its size, precision and recall. --reuse_cleanlab: an
earlier label_issues.json of the same run gives cleanlab's figures, and no fold trains again. Needs cleanlab
(`pip install cleanlab`), installed for this benchmark only.
Writes OUT/label_issues.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy
import torch
from transformers import AutoTokenizer, DataCollatorWithPadding, HfArgumentParser

from harness.label_metrics import ranking_metrics
from harness.provenance import provenance
from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer, record
from hf_selective_backprop.data import DataArguments, ImageTensorDataset, load_image_data
from hf_selective_backprop.data.text import TextDataArguments, load_text_data, tokenize
from hf_selective_backprop.models import ModelArguments, build_model, pretrained_statistics
from hf_selective_backprop.text_models import TextModelArguments, build_text_model, fitted_max_length, model_positions
from hf_selective_backprop.workflow import IMAGE_TRAINING_DEFAULTS, TEXT_TRAINING_DEFAULTS

WORKLOADS = ("image", "text")


@dataclass
class TrainingRows:
    """The noisy run's training rows as the folds cut them: ids, (noisy) labels, a fold's rows, a fresh model."""

    ids: numpy.ndarray
    labels: numpy.ndarray
    num_labels: int
    rows: Callable[[torch.Tensor, bool], object]  # (positions, to predict) -> a dataset
    new_model: Callable[[], torch.nn.Module]
    trainer_kwargs: Callable[[], dict]  # what the folds' trainers take besides the model and rows


def image_rows(config, data_args: DataArguments, model_args: ModelArguments, record_folder: str) -> TrainingRows:
    data = load_image_data(data_args, seed=config.seed, index_column=config.sb_index_column,
                           statistics=pretrained_statistics(model_args))
    train = data.train

    def rows(positions, to_predict):
        fold = ImageTensorDataset(train.images[positions], train.labels[positions], train.transform,
                                  train.index[positions])
        return fold.without_augmentation() if to_predict else fold

    def new_model():
        return build_model(model_args, data.num_labels, data.image_size, data.mean, data.std, data.num_channels,
                           data.label_names)

    return TrainingRows(train.index.numpy(), train.labels.numpy(), data.num_labels, rows, new_model, dict)


def text_rows(config, data_args: TextDataArguments, model_args: TextModelArguments, record_folder: str) -> TrainingRows:
    data = load_text_data(data_args)

    @functools.cache
    def tokenized():
        """Only the folds need the tokens: the labels are the dataset's own (tokenizing keeps every row in order)."""
        # The vocabulary the noisy run trained with, saved beside its model (a pretrained one's, or the one it learnt).
        tokenizer = AutoTokenizer.from_pretrained(record_folder)
        max_length = fitted_max_length(data_args.max_length, tokenizer, model_positions(model_args))
        train = tokenize(data.train, tokenizer, data.text_column, max_length, label_column=data.label_column,
                         text_pair_column=data_args.text_pair_column)
        return tokenizer, max_length, train

    def rows(positions, to_predict):
        return tokenized()[2].select(positions.tolist())

    def new_model():
        tokenizer, max_length, _ = tokenized()
        return build_text_model(model_args, tokenizer, data_args.task, max_length, data.label_names)

    def trainer_kwargs():
        tokenizer = tokenized()[0]
        return dict(data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer)

    # Row positions are the ids a text run's record keys (its tokenized rows carry no id column).
    labels = numpy.asarray(data.train[data.label_column])
    return TrainingRows(numpy.arange(len(labels)), labels, len(data.label_names), rows, new_model, trainer_kwargs)


def cross_validated_probabilities(config, data: TrainingRows, folds: int) -> tuple[numpy.ndarray, float]:
    """Out-of-sample class probabilities of every training row, from ``folds`` trainings; and their seconds."""
    count = len(data.ids)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(config.seed))
    probabilities = numpy.zeros((count, data.num_labels))
    seconds = 0.0
    for fold in range(folds):
        held = order[fold::folds]
        kept = order[~torch.isin(order, held)]
        fold_config = dataclasses.replace(config, output_dir=os.path.join(config.output_dir, f"fold{fold}"),
                                          sb_record=False, save_strategy="no", eval_strategy="no")
        trainer = SelectiveBackpropTrainer(model=data.new_model(), args=fold_config,
                                           train_dataset=data.rows(kept, False), **data.trainer_kwargs())
        start = time.perf_counter()
        trainer.train()
        seconds += time.perf_counter() - start
        logits = trainer.predict(data.rows(held, True)).predictions
        probabilities[held.numpy()] = torch.softmax(torch.as_tensor(logits), -1).numpy()
        print(f"fold {fold}: trained on {len(kept)}, predicted {len(held)}", flush=True)
    return probabilities, seconds


def flagged_sets(table, id_column: str, ids: numpy.ndarray, labels: numpy.ndarray, flipped: numpy.ndarray) -> dict:
    """What `record.label_issues(table, by=...)` flags for each ranking: how many rows, the share of them flipped
    and the share of the flips among them. A record written before it kept labels gets the run's (noisy) ones."""
    if "label" not in table.column_names:
        by_id = dict(zip(ids.tolist(), labels.tolist(), strict=True))
        table = table.add_column("label", [by_id.get(int(i), -1) for i in table[id_column]])
    position = {int(i): p for p, i in enumerate(ids)}
    sets = {}
    for by in record.LABEL_ISSUE_RANKINGS:
        try:
            chosen = record.label_issues(table, by=by)[id_column]
        except ValueError as why:  # a ranking this record cannot give (aum before the margins were recorded)
            print(f"by={by}: {why}")
            continue
        flagged = numpy.zeros(len(ids), dtype=bool)
        flagged[[position[int(i)] for i in chosen]] = True
        sets[by] = {"flagged": int(flagged.sum()),
                    "precision_flagged": float(flipped[flagged].mean()) if flagged.any() else None,
                    "recall_flagged": float(flagged[flipped].mean())}
    return sets


def build_parser(workload: str = "image") -> HfArgumentParser:
    if workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    if workload == "image":
        parser = HfArgumentParser((SelectiveBackpropConfig, DataArguments, ModelArguments))
        defaults = IMAGE_TRAINING_DEFAULTS
    else:
        parser = HfArgumentParser((SelectiveBackpropConfig, TextDataArguments, TextModelArguments))
        defaults = TEXT_TRAINING_DEFAULTS
    # The folds train as the record's run did: a bare TrainingArguments would give them batch 8 and AdamW.
    parser.set_defaults(**defaults)
    parser.add_argument("--workload", default="image", choices=WORKLOADS,
                        help="image: a scripts/train.py run; text: a scripts/train_text.py run")
    parser.add_argument("--record", required=True, help="the noisy run's output folder")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--reuse_cleanlab", default=None,
                        help="an earlier label_issues.json of the same run and folds: its cleanlab figures are kept "
                             "and no fold trains again; the record's are computed afresh")
    return parser


def workload_of(argv: list[str] | None) -> str:
    """--workload alone, read first: it decides which data and model flags the full parser takes."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--workload", default="image")
    return first.parse_known_args(argv)[0].workload


def main(argv: list[str] | None = None) -> None:
    config, data_args, model_args, options = build_parser(workload_of(argv)).parse_args_into_dataclasses(argv)
    rows_of = image_rows if options.workload == "image" else text_rows
    data = rows_of(config, data_args, model_args, options.record)
    ids, labels = data.ids, data.labels
    flipped_ids = numpy.fromfile(os.path.join(options.record, "noisy_indices.int64"), dtype=numpy.int64)
    flipped = numpy.isin(ids, flipped_ids)

    if options.reuse_cleanlab is not None:
        with open(options.reuse_cleanlab) as handle:
            cleanlab = json.load(handle)["cleanlab"]
    else:
        from cleanlab.filter import find_label_issues
        from cleanlab.rank import get_label_quality_scores

        probabilities, cv_seconds = cross_validated_probabilities(config, data, options.folds)
        issues = find_label_issues(labels, probabilities)
        quality = get_label_quality_scores(labels, probabilities)
        cleanlab = {**ranking_metrics(-quality, issues, flipped), "seconds": cv_seconds, "trainings": options.folds}

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
        "record_flagged": flagged_sets(table, config.sb_index_column, ids, labels, flipped),
        "cleanlab": cleanlab,
    }
    os.makedirs(config.output_dir, exist_ok=True)
    with open(os.path.join(config.output_dir, "label_issues.json"), "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=2))


if __name__ == "__main__":
    main()
