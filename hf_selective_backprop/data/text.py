"""Text data for Selective-Backprop runs: find the columns, train a tokenizer offline, tokenize.

Rows are tokenized without padding: the data collator pads each selection batch, and the
trainer pads each training micro-batch again to its own longest row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy
import pyarrow
import pyarrow.compute
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from .labels import warn_of_rare_classes
from .noise import flip_labels
from .sources import load_splits

logger = logging.getLogger(__name__)

TASKS = ("text-classification", "causal-lm")
TEXT_COLUMNS = ("sentence", "text", "content", "review", "document", "sentence1", "question")
LABEL_COLUMNS = ("label", "labels")
STRING_DTYPES = ("string", "large_string")
SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}


@dataclass
class TextDataArguments:
    dataset: str = field(
        default="stanfordnlp/sst2",
        metadata={"help": "Hub id or local folder (Hub layout, e.g. path/to/sst2) of a dataset with a text "
                  "column and, for text-classification, a label column."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Dataset config name."})
    task: str = field(
        default="text-classification",
        metadata={"help": "'text-classification' (accuracy) or 'causal-lm' (a language model on the texts; "
                  "perplexity).", "choices": list(TASKS)},
    )
    text_column: str | None = field(
        default=None, metadata={"help": f"Text column (default: the first of {', '.join(TEXT_COLUMNS)}, or the "
                                "only string column)."}
    )
    text_pair_column: str | None = field(
        default=None, metadata={"help": "Second text column for sentence-pair tasks (e.g. sentence2)."}
    )
    label_column: str | None = field(
        default=None, metadata={"help": "Label column (default: 'label' or 'labels', or the only class-label column)."}
    )
    train_split: str = field(default="train", metadata={"help": "Split to train on (and train the tokenizer on)."})
    eval_split: str | None = field(
        default="validation", metadata={"help": "Split to evaluate on ('' or 'none': no evaluation)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Train on the first N examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N examples."})
    label_noise: float = field(
        default=0.0,
        metadata={"help": "text-classification: fraction in [0, 1) of training labels flipped to a random other "
                  "class (which rows: noisy_indices.int64 in --output_dir, by row position)."},
    )
    label_noise_seed: int = field(default=0, metadata={"help": "Seed choosing the flipped labels."})
    max_length: int = field(default=128, metadata={"help": "Truncate texts to this many tokens."})
    cache_dir: str | None = field(default=None, metadata={"help": "Cache folder for `datasets`."})

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("max_train_samples", "max_eval_samples", "max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        if self.eval_split is not None and self.eval_split.lower() in ("", "none"):
            self.eval_split = None
        if not 0.0 <= self.label_noise < 1.0:
            raise ValueError(f"--label_noise must be in [0, 1), got {self.label_noise}")
        if self.label_noise and self.task != "text-classification":
            raise ValueError(f"--label_noise flips class labels; --task {self.task!r} has none (use "
                             "--task text-classification)")


@dataclass
class TextData:
    """Raw splits and what was found out about them."""

    train: datasets.Dataset
    eval: datasets.Dataset | None
    dataset_id: str  # the Hub id, or a local folder's name
    text_column: str
    label_column: str | None
    label_names: list[str] | None
    #: Positions in ``train`` whose label --label_noise flipped (sorted).
    noisy_positions: numpy.ndarray = field(default_factory=lambda: numpy.empty(0, dtype=numpy.int64))


def load_text_data(args: TextDataArguments) -> TextData:
    """The splits, their text and label columns, and the class names (text-classification)."""
    source, dataset_id = args.dataset, args.dataset
    if Path(source).expanduser().exists():
        source = str(Path(source).expanduser().resolve())
        dataset_id = Path(source).name
    splits = load_splits(source, args.dataset_config, args.cache_dir)
    train = _split(splits, args.train_split, "--train_split", args.max_train_samples)
    evaluation = _split(splits, args.eval_split, "--eval_split", args.max_eval_samples) if args.eval_split else None
    text_column = find_text_column(train, args.text_column)
    if args.text_pair_column is not None:
        _check_column(train, args.text_pair_column, "--text_pair_column")
    for split_flag, split_name, split in (("--train_split", args.train_split, train),
                                          ("--eval_split", args.eval_split, evaluation)):
        for column in (text_column, args.text_pair_column):
            if split is not None and column is not None:
                check_texts(split, column, f"{split_flag} {split_name!r}")
    if args.task == "causal-lm":
        return TextData(train, evaluation, dataset_id, text_column, None, None)
    label_column = find_label_column(train, args.label_column)
    if label_column in (text_column, args.text_pair_column):
        others = [name for name in train.column_names if name not in (text_column, args.text_pair_column)]
        raise ValueError(
            f"--label_column {label_column!r} is the text column: the labels must be a column of their own "
            f"(here: {', '.join(others) or 'none'})"
        )
    used = {f"--train_split {args.train_split!r}": train}
    if evaluation is not None and label_column in evaluation.column_names:
        used[f"--eval_split {args.eval_split!r}"] = evaluation
    for where, split in used.items():
        check_labels(split, label_column, where)
    names = class_names(train, label_column)
    declared = _is_class_label(train, label_column)
    if _dtype(train, label_column) in STRING_DTYPES:
        train = _to_class_ids(train, label_column, names)
        evaluation = _to_class_ids(evaluation, label_column, names) if evaluation is not None else None
    if not declared:  # inferred from the values: one stray label would add a class without a word
        used = {where: train if where.startswith("--train_split") else evaluation for where in used}
        warn_of_rare_classes({where: _class_ids(split, label_column) for where, split in used.items()}, label_column)
    noisy = numpy.empty(0, dtype=numpy.int64)
    if args.label_noise:
        train, noisy = _flip_labels(train, label_column, len(names), args.label_noise, args.label_noise_seed)
    return TextData(train, evaluation, dataset_id, text_column, label_column, names, noisy)


def _flip_labels(dataset: datasets.Dataset, column: str, num_classes: int, fraction: float,
                 seed: int) -> tuple[datasets.Dataset, numpy.ndarray]:
    """``dataset`` with ``flip_labels``' noise in ``column`` (class ids), and the flipped positions."""
    labels, flipped = flip_labels(torch.as_tensor(_class_ids(dataset, column)), fraction, num_classes, seed)
    logger.info("label noise: flipped %d of %d training labels", len(flipped), len(labels))
    labels = labels.numpy()

    def replace(batch, positions):
        return {column: labels[positions].tolist()}

    dataset = dataset.map(replace, batched=True, with_indices=True, features=dataset.features, desc="label noise")
    return dataset, flipped.numpy()


def check_labels(split: datasets.Dataset, column: str, where: str) -> None:
    """Refuse a missing label (None), naming its rows: sorting the labels into classes would fail on it."""
    values = split.with_format("arrow")[column]
    if values.null_count:
        rows = numpy.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
        listed = ", ".join(str(row) for row in rows[:5]) + (f", ... ({len(rows)} rows)" if len(rows) > 5 else "")
        noun, those = ("rows", "those") if len(rows) > 1 else ("row", "that")
        raise ValueError(f"{where}, label column {column!r}: no label (None) at {noun} {listed}; fix or drop "
                         f"{those} {noun}")


def _class_ids(split: datasets.Dataset, column: str) -> numpy.ndarray:
    return split.with_format("arrow")[column].to_numpy(zero_copy_only=False).astype(numpy.int64)


def check_texts(split: datasets.Dataset, column: str, where: str) -> None:
    """Refuse a text column with a missing text (the tokenizer would fail on it, naming neither column nor
    row) or with no text at all (a model would train on special tokens alone)."""
    values = split.with_format("arrow")[column]
    if values.null_count:
        rows = numpy.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
        listed = ", ".join(str(row) for row in rows[:5]) + (f", ... ({len(rows)} rows)" if len(rows) > 5 else "")
        noun = "rows" if len(rows) > 1 else "row"
        those = "those" if len(rows) > 1 else "that"
        raise ValueError(
            f"{where}, text column {column!r}: no text (None) at {noun} {listed}; fix or drop {those} {noun}"
        )
    longest = pyarrow.compute.max(pyarrow.compute.utf8_length(pyarrow.compute.utf8_trim_whitespace(values))).as_py()
    if len(values) and not longest:
        raise ValueError(
            f"{where}, text column {column!r}: every text is empty, so there is nothing to learn from; pass the "
            "--text_column that holds the texts"
        )


def _split(splits: datasets.DatasetDict, name: str, flag: str, limit: int | None) -> datasets.Dataset:
    if name not in splits:
        raise ValueError(f"{flag} {name!r} is not a split of this dataset; it has {', '.join(splits)}")
    split = splits[name]
    return split.select(range(min(limit, len(split)))) if limit is not None else split


def _check_column(dataset: datasets.Dataset, column: str, flag: str) -> None:
    if column not in dataset.column_names:
        raise ValueError(f"{flag} {column!r} is not a column of the dataset; it has {', '.join(dataset.column_names)}")


def find_text_column(dataset: datasets.Dataset, given: str | None = None) -> str:
    column = _find_column(dataset, given, "text", TEXT_COLUMNS, lambda name: _dtype(dataset, name) in STRING_DTYPES)
    check_text_column(dataset, column)
    return column


def check_text_column(dataset: datasets.Dataset, column: str, where: str = "") -> None:
    """Refuse a --text_column that holds no strings (ids, labels, lists): the tokenizer would fail on it naming
    neither the flag nor the column."""
    if _dtype(dataset, column) in STRING_DTYPES:
        return
    strings = [name for name in dataset.column_names if _dtype(dataset, name) in STRING_DTYPES]
    raise ValueError(
        f"--text_column {column!r}{where} holds {feature_kind(dataset, column)} values, not text: pass a column of "
        f"strings ({'here: ' + ', '.join(strings) if strings else 'this dataset has none'})"
    )


def feature_kind(dataset: datasets.Dataset, column: str) -> str:
    """What a column holds, for messages: its dtype (int64, string), else its feature's kind (list, image)."""
    feature = dataset.features[column]
    return getattr(feature, "dtype", None) or type(feature).__name__.lower()


def find_label_column(dataset: datasets.Dataset, given: str | None = None) -> str:
    return _find_column(dataset, given, "label", LABEL_COLUMNS, lambda name: _is_class_label(dataset, name))


def _find_column(dataset: datasets.Dataset, given: str | None, what: str, usual: tuple, fits) -> str:
    """The ``--{what}_column`` given, else the first usual name present, else the only column that fits."""
    flag = f"--{what}_column"
    if given is not None:
        _check_column(dataset, given, flag)
        return given
    for name in usual:
        if name in dataset.column_names:
            return name
    candidates = [name for name in dataset.column_names if fits(name)]
    if len(candidates) == 1:
        return candidates[0]
    raise ValueError(f"cannot tell which column holds the {what} among {', '.join(dataset.column_names)}: pass {flag}")


def _is_class_label(dataset: datasets.Dataset, column: str) -> bool:
    return isinstance(dataset.features[column], datasets.ClassLabel)


def _dtype(dataset: datasets.Dataset, column: str) -> str | None:
    return getattr(dataset.features[column], "dtype", None)


def class_names(dataset: datasets.Dataset, column: str) -> list[str]:
    """The ClassLabel's names, else the sorted distinct values (integers 0..K-1, or strings numbered in order)."""
    if _is_class_label(dataset, column):
        return list(dataset.features[column].names)
    dtype = _dtype(dataset, column)
    if dtype is None:  # lists, images, nested records: no class in a cell
        raise ValueError(
            f"--label_column {column!r} holds {feature_kind(dataset, column)} values: text-classification needs "
            "class labels, integers 0..K-1, strings or a ClassLabel"
        )
    values = sorted(dataset.unique(column))
    if dtype in STRING_DTYPES:
        return values
    if dtype is not None and dtype.startswith(("int", "uint")) and values == list(range(len(values))):
        return [str(v) for v in values]
    raise ValueError(
        f"--label_column {column!r} holds {dtype} values {values[:5]}: text-classification needs class labels, "
        "integers 0..K-1, strings or a ClassLabel"
    )


def _to_class_ids(dataset: datasets.Dataset, column: str, names: list[str]) -> datasets.Dataset:
    ids = {name: i for i, name in enumerate(names)}

    def convert(batch):
        unknown = {str(v) for v in batch[column]} - ids.keys()
        if unknown:
            raise ValueError(f"--label_column {column!r} holds {sorted(unknown)[:5]}, not seen in the train split")
        return {column: [ids[str(v)] for v in batch[column]]}

    features = dataset.features.copy()
    features[column] = datasets.ClassLabel(names=names)
    return dataset.map(convert, batched=True, features=features, desc="label ids")


def train_wordpiece_tokenizer(texts: Iterator[str], vocab_size: int = 8000, max_length: int = 128,
                              lowercase: bool = True, token_type_ids: bool = True) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer learnt from ``texts`` (no download).

    Encodings read ``[CLS] text [SEP]`` (pairs ``[CLS] a [SEP] b [SEP]``): [CLS] is what a BERT
    classifier pools, and for a causal LM it is the start token and [SEP] the end token.
    ``token_type_ids=False`` for models without segment embeddings (GPT-2 would add the
    embedding of token 0 to every position).
    """
    tokenizer = Tokenizer(models.WordPiece(unk_token=SPECIAL_TOKENS["unk_token"]))
    steps = [normalizers.NFD(), normalizers.StripAccents()]
    tokenizer.normalizer = normalizers.Sequence(([normalizers.Lowercase()] if lowercase else []) + steps)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS.values()),
                                        show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    input_names = ["input_ids", "attention_mask"] + (["token_type_ids"] if token_type_ids else [])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=max_length, bos_token="[CLS]", eos_token="[SEP]",
        model_input_names=input_names, **SPECIAL_TOKENS,
    )


def tokenize(dataset: datasets.Dataset, tokenizer, text_column: str, max_length: int,
             label_column: str | None = None, text_pair_column: str | None = None) -> datasets.Dataset:
    """Token ids (unpadded) and ``labels``; every other column is dropped."""

    def encode(batch):
        pair = batch[text_pair_column] if text_pair_column else None
        encoded = tokenizer(batch[text_column], pair, truncation=True, max_length=max_length)
        if label_column is not None:
            encoded["labels"] = batch[label_column]
        return encoded

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenize")


#: The longest word WordPiece splits into pieces (its ``max_input_chars_per_word``); a longer one is one [UNK].
WORDPIECE_MAX_WORD_CHARS = 100


def texts_of(dataset: datasets.Dataset, *columns: str | None, batch_size: int = 1000,
             max_length: int | None = None) -> Iterator[list[str]]:
    """Batches of the texts in ``columns`` (None skipped), for tokenizer training.

    With ``max_length`` (tokens), each text is cut to the characters its first ``max_length`` tokens can span
    (``max_length * WORDPIECE_MAX_WORD_CHARS``): the rest is truncated away before training ever reads it, and
    one very long text would otherwise cost minutes and gigabytes of tokenizer training.
    """
    limit = None if max_length is None else max_length * WORDPIECE_MAX_WORD_CHARS
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        for column in columns:
            if column is not None:
                yield rows[column] if limit is None else [text[:limit] for text in rows[column]]


def label_completions(dataset: datasets.Dataset, text_column: str, label_column: str, names: list[str],
                      prompt_suffix: str = " sentiment :") -> datasets.Dataset:
    """Prompt-completion pairs for supervised fine-tuning: the text (then ``prompt_suffix``) as the prompt, its
    label's name as the completion, so that a language model is trained (and scored) on the answer alone.

    Labels must be class ids into ``names`` (`load_text_data` converts string labels); a row without one (SST-2's
    test split marks them -1) is refused, naming it, since it has no completion to learn.
    """
    labels = numpy.asarray(dataset[label_column])
    bad = numpy.flatnonzero((labels < 0) | (labels >= len(names)))
    if len(bad):
        listed = ", ".join(str(row) for row in bad[:5]) + (f", ... ({len(bad)} rows)" if len(bad) > 5 else "")
        raise ValueError(
            f"label column {label_column!r}: rows {listed} have no label in 0..{len(names) - 1} ({names}), so no "
            "completion; use a labelled split"
        )
    return dataset.map(
        lambda batch: {"prompt": [text + prompt_suffix for text in batch[text_column]],
                       "completion": [" " + names[label] for label in batch[label_column]]},
        batched=True, remove_columns=dataset.column_names,
    )
