"""Text data: column detection, label ids, the offline tokenizer, and scripts/train_text.py end to end."""

import json
import logging
import os
import runpy
import sys
from pathlib import Path

import numpy
import pytest
import torch
from datasets import Dataset
from huggingface_hub import ModelCard
from text_tiny import NEGATIVE, POSITIVE
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from hf_selective_backprop import record
from hf_selective_backprop.data.text import (
    WORDPIECE_MAX_WORD_CHARS,
    TextDataArguments,
    class_names,
    load_text_data,
    texts_of,
    train_wordpiece_tokenizer,
)

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "sst2"
if not SST2.is_dir():
    SST2 = Path("/work/shared/data/sst2")

def test_columns_are_found_and_string_labels_numbered(review_folder):
    data = load_text_data(TextDataArguments(dataset=str(review_folder), label_column="sentiment"))
    assert data.text_column == "review" and data.label_column == "sentiment"
    assert data.label_names == ["neg", "pos"]
    assert data.dataset_id == "reviews"
    assert data.train[0]["sentiment"] == 1 and data.eval[4]["sentiment"] == 0
    assert len(data.train) == 96 and len(data.eval) == 8


def test_missing_columns_and_splits_name_the_flag(review_folder):
    with pytest.raises(ValueError, match="cannot tell which column holds the label among id, review, sentiment: "
                                         "pass --label_column"):
        load_text_data(TextDataArguments(dataset=str(review_folder)))
    with pytest.raises(ValueError, match="--text_column 'body' is not a column of the dataset; it has id, review"):
        load_text_data(TextDataArguments(dataset=str(review_folder), text_column="body", label_column="sentiment"))
    with pytest.raises(ValueError, match="--eval_split 'test' is not a split of this dataset; it has train, "):
        load_text_data(TextDataArguments(dataset=str(review_folder), label_column="sentiment", eval_split="test"))
    with pytest.raises(ValueError, match=r"--label_column 'y' holds float64 values \[0.5, 1.0\]: .*needs class labels"):
        class_names(Dataset.from_dict({"y": [0.5, 1.0]}), "y")
    with pytest.raises(ValueError, match=r"'y' holds int64 values \[1, 2\]: text-classification needs class labels, "
                                         "integers 0..K-1"):
        class_names(Dataset.from_dict({"y": [1, 2]}), "y")
    with pytest.raises(ValueError, match="--task must be one of text-classification, causal-lm"):
        TextDataArguments(task="summarization")


def labelled_folder(folder: Path, labels: list) -> Path:
    """A local dataset in the Hub layout (JSON Lines: a missing label stays None) with these train labels."""
    folder.mkdir()
    texts = POSITIVE + NEGATIVE
    rows = [{"review": texts[i % len(texts)], "label": label} for i, label in enumerate(labels)]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_a_missing_label_names_its_row_and_column(tmp_path):
    # It failed with a raw TypeError from sorting the labels, naming no row.
    labels = [0, 1] * 20
    labels[7] = None
    folder = labelled_folder(tmp_path / "reviews", labels)
    with pytest.raises(ValueError, match=r"^--train_split 'train', label column 'label': no label \(None\) at row 7; "
                       r"fix or drop that row$"):
        load_text_data(TextDataArguments(dataset=str(folder), eval_split=None))


def test_a_stray_label_is_warned_of_as_for_images(tmp_path, caplog):
    # One 2 in a binary set built a 3-class model without a word.
    labels = [0, 1] * 50
    labels[9] = 2
    folder = labelled_folder(tmp_path / "reviews", labels)
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.data.labels"):
        data = load_text_data(TextDataArguments(dataset=str(folder), eval_split=None))
    assert data.label_names == ["0", "1", "2"]
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("label column 'label': class(es) 2 have 1 example(s)" in message and "a stray label?" in message
               and "--train_split 'train': row 9 = 2 (1 row)" in message for message in warned), warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.data.labels"):
        load_text_data(TextDataArguments(dataset=str(labelled_folder(tmp_path / "clean", [0, 1, 2] * 30)),
                                         eval_split=None))
    assert not [record for record in caplog.records if "stray label" in record.getMessage()]


def test_trained_tokenizer_adds_cls_and_sep_and_reloads(tmp_path):
    tokenizer = train_wordpiece_tokenizer(iter([POSITIVE + NEGATIVE]), vocab_size=80, max_length=16)
    encoded = tokenizer(["great acting", "dull"])
    first = encoded["input_ids"][0]
    assert first[0] == tokenizer.cls_token_id and first[-1] == tokenizer.sep_token_id
    assert tokenizer.pad_token_id is not None and "token_type_ids" in encoded
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(["great acting", "dull"])["input_ids"] == encoded["input_ids"]
    causal = train_wordpiece_tokenizer(iter([POSITIVE]), vocab_size=60, token_type_ids=False)
    assert "token_type_ids" not in causal("great acting")


@pytest.mark.skipif(not SST2.is_dir(), reason=f"SST-2 is not at {SST2} (a local copy in the Hub layout)")
def test_label_noise_flips_its_share_of_the_training_labels_and_says_which_rows(review_folder):
    def load(**noise):
        return load_text_data(TextDataArguments(dataset=str(review_folder), label_column="sentiment", **noise))

    clean, noisy, again = load(), load(label_noise=0.25, label_noise_seed=3), load(label_noise=0.25, label_noise_seed=3)
    changed = numpy.flatnonzero(numpy.asarray(clean.train["sentiment"]) != numpy.asarray(noisy.train["sentiment"]))
    assert len(changed) == 24 and changed.tolist() == noisy.noisy_positions.tolist()  # round(0.25 * 96) rows
    assert noisy.noisy_positions.tolist() == again.noisy_positions.tolist()
    assert noisy.noisy_positions.tolist() != load(label_noise=0.25, label_noise_seed=4).noisy_positions.tolist()
    assert noisy.train.features["sentiment"].names == ["neg", "pos"]
    assert noisy.eval["sentiment"] == clean.eval["sentiment"] and len(clean.noisy_positions) == 0


@pytest.mark.parametrize("settings, message", [
    (dict(label_noise=1.0), r"--label_noise must be in \[0, 1\), got 1.0"),
    (dict(label_noise=0.1, task="causal-lm"), "--label_noise flips class labels; --task 'causal-lm' has none"),
])
def test_label_noise_out_of_range_or_on_a_language_model_is_refused_naming_the_flag(settings, message):
    with pytest.raises(ValueError, match=message):
        TextDataArguments(**settings)


def test_sst2_columns_are_detected():
    data = load_text_data(TextDataArguments(dataset=str(SST2), max_train_samples=50, max_eval_samples=10))
    assert (data.text_column, data.label_column, data.label_names) == ("sentence", "label", ["negative", "positive"])


def run_script(argv: list[str]) -> None:
    old = sys.argv
    sys.argv = ["train_text.py", *argv]
    try:
        runpy.run_path(str(ROOT / "scripts" / "train_text.py"), run_name="__main__")
    finally:
        sys.argv = old


COMMON = ["--vocab_size", "80", "--hidden_size", "16", "--num_heads", "2", "--num_layers", "1",
          "--intermediate_size", "32", "--max_length", "16", "--per_device_train_batch_size", "8",
          "--use_cpu", "--disable_tqdm", "true", "--save_strategy", "no", "--seed", "0"]


def test_script_trains_a_classifier_with_sb_and_writes_card_stats_and_tokenizer(review_folder, tmp_path):
    out = tmp_path / "run"
    run_script(["--dataset", str(review_folder), "--label_column", "sentiment", "--sb_strategy", "sb",
                "--num_train_epochs", "2", "--output_dir", str(out), *COMMON])
    stats = json.loads((out / "sb_stats.json").read_text())
    assert stats["selection_forwards"] == 2 * 96 and 0 < stats["backwards"] < 2 * 96
    # As the Hugging Face example scripts end: the run's state, log history included, beside the model.
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == stats["optimizer_steps"] > 0
    assert any("train_runtime" in entry for entry in state["log_history"])
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text-classification"
    assert "selective-backprop" in card.data.tags and "timm" not in card.data.tags
    assert "sb_strategy" in card.text and "accuracy (validation)" in card.text
    assert json.loads((out / "eval_results.json").read_text())["eval_accuracy"] >= 0
    classify = pipeline("text-classification", model=str(out), device="cpu")
    assert classify("great acting")[0]["label"] in ("neg", "pos")


def test_script_with_label_noise_writes_the_flipped_ids_its_record_keys_and_its_training_cost(review_folder, tmp_path):
    out = tmp_path / "noisy"
    run_script(["--dataset", str(review_folder), "--label_column", "sentiment", "--label_noise", "0.25",
                "--num_train_epochs", "1", "--output_dir", str(out), *COMMON])
    flipped = numpy.fromfile(out / "noisy_indices.int64", dtype=numpy.int64)
    expected = load_text_data(TextDataArguments(dataset=str(review_folder), label_column="sentiment",
                                                label_noise=0.25)).noisy_positions
    assert flipped.tolist() == expected.tolist() and len(flipped) == 24
    table = record.load_record(str(out))
    assert sorted(table["index"]) == list(range(96))  # the record's ids are the row positions the file names
    assert json.loads((out / "train_results.json").read_text())["train_runtime"] > 0


def test_script_trains_a_causal_lm_and_reports_perplexity(review_folder, tmp_path):
    out = tmp_path / "lm"
    run_script(["--dataset", str(review_folder), "--task", "causal-lm", "--sb_strategy", "sb", "--sb_keep", "0.5",
                "--num_train_epochs", "1", "--output_dir", str(out), *COMMON])
    results = json.loads((out / "eval_results.json").read_text())
    assert results["eval_perplexity"] == pytest.approx(torch.tensor(results["eval_loss"]).exp().item(), rel=1e-5)
    assert ModelCard.load(out / "README.md").data.pipeline_tag == "text-generation"
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.n_layer == 1 and os.path.isfile(out / "tokenizer.json")


def test_train_tokenizer_script_saves_a_tokenizer_the_text_script_reuses(review_folder, tmp_path):
    old = sys.argv
    sys.argv = ["train_tokenizer.py", "--dataset", str(review_folder), "--label_column", "sentiment",
                "--vocab_size", "80", "--max_length", "16", "--output_dir", str(tmp_path / "tok")]
    try:
        runpy.run_path(str(ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")
    finally:
        sys.argv = old
    saved = AutoTokenizer.from_pretrained(tmp_path / "tok")
    out = tmp_path / "run"
    run_script(["--dataset", str(review_folder), "--label_column", "sentiment", "--tokenizer_name",
                str(tmp_path / "tok"), "--num_train_epochs", "1", "--output_dir", str(out), *COMMON])
    assert AutoTokenizer.from_pretrained(out).get_vocab() == saved.get_vocab()


def test_tokenizer_training_reads_only_what_max_length_can_use():
    long_text = "word " * 600_000  # 3,000,000 characters
    data = Dataset.from_dict({"text": ["short text", long_text]})
    batches = list(texts_of(data, "text", max_length=16))
    assert batches == [["short text", long_text[: 16 * WORDPIECE_MAX_WORD_CHARS]]]
    assert list(texts_of(data, "text")) == [["short text", long_text]]  # without max_length, as they are


def test_a_text_column_without_strings_is_refused_naming_it(review_folder):
    # The tokenizer failed on the integers, naming neither the flag nor the column.
    with pytest.raises(ValueError, match=r"^--text_column 'id' holds int64 values, not text: pass a column of strings "
                       r"\(here: review, sentiment\)"):
        load_text_data(TextDataArguments(dataset=str(review_folder), text_column="id", label_column="sentiment"))


@pytest.mark.parametrize("arguments", ["text", "image"])
@pytest.mark.parametrize("damaged", ["model.safetensors", "config.json"])
def test_a_truncated_model_folder_is_refused_naming_the_flag_and_the_file(tmp_path, damaged, arguments):
    # from_pretrained's errors (safetensors' "incomplete metadata", a JSON decode error) named neither.
    from text_tiny import sequence_classifier

    from hf_selective_backprop.models import ModelArguments
    from hf_selective_backprop.text_models import TextModelArguments

    folder = tmp_path / "bert"
    sequence_classifier().save_pretrained(folder)
    whole = (folder / damaged).read_bytes()
    (folder / damaged).write_bytes(whole[: len(whole) // 2])  # a copy or a save cut short
    with pytest.raises(ValueError, match=rf"^--model_name_or_path '{folder}': {damaged} cannot be read \(truncated or "
                       r"damaged"):
        (TextModelArguments if arguments == "text" else ModelArguments)(model_name_or_path=str(folder))


def test_an_image_classifier_is_refused_naming_the_flag_and_what_the_script_needs(review_folder, tmp_path, monkeypatch):
    # It failed loading a tokenizer from the image model's folder, naming neither the flag nor the problem.
    import hf_selective_backprop.data.text as text_data
    from hf_selective_backprop.models import ModelArguments, build_model

    monkeypatch.setattr(text_data, "load_text_data", lambda *args, **kwargs: pytest.fail("the data was read"))
    folder = tmp_path / "resnet"
    build_model(ModelArguments(model="resnet18"), 2, 8, (0.5,), (0.25,), in_chans=1).save_pretrained(folder)
    with pytest.raises(ValueError, match=rf"^--model_name_or_path '{folder}' is an image classifier "
                       r"\(TimmWrapperForImageClassification\): scripts/train_text.py --task text-classification "
                       r"needs a text model that AutoModelForSequenceClassification can put a classifier on"):
        run_script(["--dataset", str(review_folder), "--label_column", "sentiment", "--model_name_or_path",
                    str(folder), "--output_dir", str(tmp_path / "run"), *COMMON])
    assert not (tmp_path / "run").exists()


def test_weights_with_a_garbage_header_length_are_refused_as_unreadable(tmp_path):
    # The header's length was read as it stood: 10^12 bytes ended in a raw MemoryError naming neither.
    import struct

    from text_tiny import sequence_classifier

    from hf_selective_backprop.models import ModelArguments
    from hf_selective_backprop.text_models import TextModelArguments

    folder = tmp_path / "bert"
    sequence_classifier().save_pretrained(folder)
    whole = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + whole[8:])
    for arguments in (TextModelArguments, ModelArguments):
        with pytest.raises(ValueError, match=rf"^--model_name_or_path '{folder}': model.safetensors cannot be read "
                           r"\(truncated or damaged"):
            arguments(model_name_or_path=str(folder))


def test_max_length_is_fitted_to_the_models_positions_when_the_tokenizer_has_no_limit(tmp_path, caplog):
    # A tokenizer saved without model_max_length reads as unlimited: 32-token rows overran the model's 8 positions.
    from text_tiny import sequence_classifier, word_tokenizer, write_split

    (tmp_path / "long").mkdir()
    rows = [{"review": " ".join(POSITIVE), "sentiment": "pos"}, {"review": " ".join(NEGATIVE), "sentiment": "neg"}]
    write_split(tmp_path / "long" / "train.csv", rows * 8)  # 16 texts of 14 and 11 words
    folder = tmp_path / "bert"
    tokenizer = word_tokenizer(POSITIVE + NEGATIVE)
    sequence_classifier(max_position_embeddings=8, vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("model_max_length", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.text_models"):
        run_script(["--dataset", str(tmp_path / "long"), "--label_column", "sentiment", "--model_name_or_path",
                    str(folder), "--max_length", "32", "--sb_strategy", "none", "--eval_split", "none",
                    "--eval_strategy", "no", "--per_device_train_batch_size", "8", "--use_cpu", "--disable_tqdm",
                    "true", "--save_strategy", "no", "--output_dir", str(out)])
    assert ("--max_length 32 is longer than the model takes (its config's max_position_embeddings, 8): texts are "
            "truncated to 8 tokens") in caplog.text
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize("strategy", ["sb", "none"])
def test_a_resume_with_another_max_length_is_refused_naming_it(review_folder, tmp_path, strategy):
    # A model built from scratch has --max_length positions: a shorter one failed on the weights with torch's size
    # mismatch (a longer one is cut to the saved tokenizer's model_max_length, with a warning).
    out = tmp_path / "run"
    run = ["--dataset", str(review_folder), "--label_column", "sentiment", "--sb_strategy", strategy,
           "--eval_split", "none", "--eval_strategy", "no", "--output_dir", str(out), *COMMON,
           "--save_strategy", "epoch"]
    run_script([*run, "--num_train_epochs", "1"])
    checkpoint = next(out.glob("checkpoint-*"))
    with pytest.raises(ValueError, match=r"the model flags differ from the saved run's:\n  --max_length: saved 16, now "
                       r"8\n"):
        run_script([*run, "--num_train_epochs", "2", "--max_length", "8", "--resume_from_checkpoint", str(checkpoint)])
