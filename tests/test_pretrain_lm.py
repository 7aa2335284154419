"""scripts/pretrain_lm.py: the task-adaptive pretrained stand-ins that the fine-tuning benchmark fine-tunes."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from text_tiny import write_review_folder
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]


def pretrain(folder, output_dir, *flags):
    argv = ["pretrain_lm.py", "--dataset", str(folder), "--text_column", "review", "--splits", "train,validation",
            "--num_layers", "1", "--hidden_size", "16", "--num_heads", "2", "--intermediate_size", "32",
            "--vocab_size", "200", "--num_train_epochs", "1", "--per_device_train_batch_size", "16",
            "--use_cpu", "true", "--disable_tqdm", "true", "--output_dir", str(output_dir), *flags]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(ROOT / "scripts" / "pretrain_lm.py"), run_name="__main__")
    finally:
        sys.argv = old


def test_masked_lm_pretraining_gives_an_encoder_that_a_classifier_loads(tmp_path):
    data = write_review_folder(tmp_path / "reviews")
    pretrain(data, tmp_path / "bert", "--objective", "mlm")
    saved = load_file(tmp_path / "bert" / "model.safetensors")
    training = json.loads((tmp_path / "bert" / "train_results.json").read_text())
    assert training["train_runtime"] > 0 and training["train_samples"] > 0
    # No split is held out (each one --splits names is pretrained on): all_results.json is the training's alone.
    assert json.loads((tmp_path / "bert" / "all_results.json").read_text()) == training
    assert not (tmp_path / "bert" / "eval_results.json").exists()
    state = json.loads((tmp_path / "bert" / "trainer_state.json").read_text())  # as the HF example scripts end
    assert state["global_step"] == state["max_steps"] > 0
    assert any("train_runtime" in entry for entry in state["log_history"])
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "bert", num_labels=2)
    loaded = classifier.state_dict()
    encoder = [name for name in saved if name.startswith("bert.encoder.") or name.startswith("bert.embeddings.")]
    assert encoder and all(torch.equal(loaded[name], saved[name]) for name in encoder)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bert")
    assert tokenizer.mask_token is not None and len(tokenizer) <= 200


def test_causal_pretraining_gives_a_language_model_and_its_tokenizer(tmp_path):
    data = write_review_folder(tmp_path / "reviews")
    pretrain(data, tmp_path / "gpt2", "--objective", "causal")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2")
    assert model.config.model_type == "gpt2" and model.config.n_layer == 1
    assert AutoTokenizer.from_pretrained(tmp_path / "gpt2").vocab_size == model.config.vocab_size


def test_a_split_the_dataset_lacks_is_refused_naming_the_flag(tmp_path):
    data = write_review_folder(tmp_path / "reviews")
    with pytest.raises(ValueError, match=r"--splits names \['test'\]"):
        pretrain(data, tmp_path / "bert", "--splits", "train,test")


def test_fine_tuning_a_model_with_fewer_positions_than_max_length_truncates_to_them_and_says_so(tmp_path, caplog):
    """A model pretrained on 4-token texts has 4 positions: --max_length 128 rows would index past them."""
    from harness.workloads import text_workload
    from hf_selective_backprop.data.text import TextDataArguments
    from hf_selective_backprop.text_models import TextModelArguments

    data = write_review_folder(tmp_path / "reviews")
    pretrain(data, tmp_path / "bert", "--objective", "mlm", "--max_length", "4")
    data_args = TextDataArguments(dataset=str(data), label_column="sentiment", max_length=128)
    with caplog.at_level("WARNING", logger="hf_selective_backprop.text_models"):
        workload = text_workload(data_args, TextModelArguments(model_name_or_path=str(tmp_path / "bert")), 0)
    assert "--max_length 128 is longer than the model takes (its tokenizer's model_max_length, 4)" in caplog.text
    lengths = [len(ids) for ids in workload.train["input_ids"]]
    assert max(lengths) == 4
    model = workload.build_model()
    batch = workload.data_collator([workload.train[i] for i in range(8)])
    batch.pop("sb_index", None)
    assert model(**{k: v for k, v in batch.items() if k != "labels"}).logits.shape == (8, 2)


@pytest.fixture
def loads(monkeypatch):
    """How often pretrain_lm.py opens the dataset."""
    import hf_selective_backprop.data.sources as sources

    opened, load = [], sources.load_splits

    def counted(*args, **kwargs):
        opened.append(args[0])
        return load(*args, **kwargs)

    monkeypatch.setattr(sources, "load_splits", counted)
    return opened


def test_a_finished_run_is_not_overwritten_without_the_flag(tmp_path, loads):
    # pretrain_lm.py replaced a finished run's weights, tokenizer and config beside its other files.
    data, out = write_review_folder(tmp_path / "reviews"), tmp_path / "bert"
    pretrain(data, out, "--save_strategy", "no")
    written = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    opened = len(loads)
    with pytest.raises(ValueError, match=r"^--output_dir '.*bert' already holds a finished run \(model.safetensors\) "
                       r"and other files \(.*\), which a new run would overwrite. Pass --overwrite_output_dir"):
        pretrain(data, out, "--save_strategy", "no", "--num_layers", "2")
    assert len(loads) == opened  # refused before the dataset was opened
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == written
    pretrain(data, out, "--save_strategy", "no", "--num_layers", "2", "--overwrite_output_dir")
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2


@pytest.mark.parametrize("flags, message", [
    (["--splits", ","], r"^--splits names no split \(got ','\): pass comma-separated split names, e.g. train,"),
    (["--max_length", "0"], r"^--max_length must be >= 1, got 0"),
])
def test_a_bad_flag_is_refused_before_anything_is_read_or_written(tmp_path, loads, flags, message):
    # --splits ',' failed in datasets' concatenate_datasets; --max_length 0 after the tokenizer was written.
    data, out = write_review_folder(tmp_path / "reviews"), tmp_path / "bert"
    with pytest.raises(ValueError, match=message):
        pretrain(data, out, *flags)
    assert not loads and not out.exists()


def test_a_text_column_without_text_is_refused_naming_it(tmp_path):
    data = write_review_folder(tmp_path / "reviews")
    with pytest.raises(ValueError, match=r"^--text_column 'id' of split 'train' holds int64 values, not text: pass a "
                       r"column of strings \(here: review, sentiment\)"):
        pretrain(data, tmp_path / "bert", "--text_column", "id")
    assert not (tmp_path / "bert" / "tokenizer.json").exists()


def test_a_resume_with_another_max_length_is_refused_before_any_data_is_read(tmp_path, loads):
    # The model's position embeddings are --max_length long: the resume failed on the weights, after the data.
    data, out = write_review_folder(tmp_path / "reviews"), tmp_path / "bert"
    pretrain(data, out)
    checkpoint = next(out.glob("checkpoint-*"))
    opened = len(loads)
    with pytest.raises(ValueError, match=r"the model flags differ from the saved run's:\n  --max_length: saved 64, "
                       r"now 32\n"):
        pretrain(data, out, "--resume_from_checkpoint", str(checkpoint), "--max_length", "32")
    assert len(loads) == opened


def test_a_resume_from_another_folders_checkpoint_reads_that_checkpoints_tokenizer(tmp_path):
    # The tokenizer was read from --output_dir, which a resume into a new folder does not hold.
    data = write_review_folder(tmp_path / "reviews")
    pretrain(data, tmp_path / "first")
    checkpoint = next((tmp_path / "first").glob("checkpoint-*"))
    pretrain(data, tmp_path / "second", "--resume_from_checkpoint", str(checkpoint), "--num_train_epochs", "2")
    first, second = (AutoTokenizer.from_pretrained(tmp_path / name) for name in ("first", "second"))
    assert second.get_vocab() == first.get_vocab()
    assert (tmp_path / "second" / f"checkpoint-{2 * int(checkpoint.name.split('-')[1])}").is_dir()  # epoch 2 trained


def test_a_run_stopped_before_its_first_checkpoint_restarts_with_the_same_command(tmp_path, monkeypatch):
    # The tokenizer was saved into --output_dir before training: the restart was refused as "already holds files".
    from transformers import Trainer

    data, out = write_review_folder(tmp_path / "reviews"), tmp_path / "bert"
    train = Trainer.train

    def stopped(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train", stopped)
    with pytest.raises(KeyboardInterrupt):
        pretrain(data, out)
    assert not out.exists() or not any(out.iterdir())
    monkeypatch.setattr(Trainer, "train", train)
    pretrain(data, out)
    assert AutoTokenizer.from_pretrained(out).mask_token is not None
