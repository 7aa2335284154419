"""Fine-tuning a saved image classifier (--model_name_or_path) on a subset of classes (--classes)."""

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from hf_selective_backprop.data import DataArguments, load_image_data
from hf_selective_backprop.models import ModelArguments, build_model

ROOT = Path(__file__).resolve().parents[1]
HEAD = "timm_model.fc."  # resnet18's classifier inside TimmWrapper


def train(output_dir, *flags):
    argv = ["train.py", "--dataset", "digits", "--image_size", "16", "--max_train_samples", "240", "--eval_split",
            "none", "--eval_strategy", "no", "--per_device_train_batch_size", "16", "--num_train_epochs", "1",
            "--learning_rate", "0.01", "--use_cpu", "--disable_tqdm", "true", "--output_dir", str(output_dir),
            *flags]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")
    finally:
        sys.argv = old
    return load_file(Path(output_dir) / "model.safetensors")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """resnet18 trained on digits 0-4: the stand-in for a downloaded checkpoint."""
    folder = tmp_path_factory.mktemp("pretrained") / "digits0-4"
    weights = train(folder, "--model", "resnet18", "--classes", "0,1,2,3,4", "--sb_strategy", "none")
    return folder, weights


def test_the_train_script_ends_as_the_hugging_face_examples_do_with_the_trainer_state(pretrained):
    folder, _ = pretrained
    state = json.loads((folder / "trainer_state.json").read_text())
    stats = json.loads((folder / "sb_stats.json").read_text())
    assert state["global_step"] == stats["optimizer_steps"] == 8  # 120 images of digits 0-4, batches of 16
    assert any("train_runtime" in entry for entry in state["log_history"])


def test_classes_keeps_and_relabels_the_named_classes_and_keeps_ids_as_split_positions():
    everything = load_image_data(DataArguments(dataset="digits", max_train_samples=300, eval_split="none"))
    kept = load_image_data(DataArguments(dataset="digits", max_train_samples=300, eval_split="none", classes="7,3"))
    assert kept.label_names == ["7", "3"]
    ids = kept.train.index
    original = everything.train.labels[ids]
    assert set(original.tolist()) == {3, 7}
    assert torch.equal(kept.train.labels, (original == 3).long())  # 7 -> 0, 3 -> 1, in the order given
    assert torch.equal(kept.train.images, everything.train.images[ids])
    assert len(ids) == int(((everything.train.labels == 3) | (everything.train.labels == 7)).sum())


@pytest.mark.parametrize("value, message", [
    ("5", "at least 2 classes"), ("5,5", "names a class twice"), ("a,b", "comma-separated class ids"),
    # A superscript is a digit to str.isdigit, not to int(): it was int()'s raw "invalid literal" error.
    ("²,3", "comma-separated class ids"), ("-1,3", "comma-separated class ids"),
])
def test_bad_classes_are_refused_naming_the_flag(value, message):
    with pytest.raises(ValueError, match=f"--classes.*{message}|{message}.*--classes"):
        DataArguments(dataset="digits", classes=value)


def test_classes_beyond_the_dataset_are_refused_naming_the_classes_it_has():
    with pytest.raises(ValueError, match=r"--classes names 12, but the dataset has 10 classes"):
        load_image_data(DataArguments(dataset="digits", max_train_samples=50, classes="1,12"))


def test_same_label_count_keeps_the_head_and_loads_every_weight_exactly(pretrained):
    folder, saved = pretrained
    model = build_model(ModelArguments(model_name_or_path=str(folder)), 5, 16, (0.5,) * 3, (0.25,) * 3,
                        label_names=["5", "6", "7", "8", "9"])
    loaded = model.state_dict()
    assert saved.keys() == loaded.keys()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    assert model.config.id2label == {0: "5", 1: "6", 2: "7", 3: "8", 4: "9"}
    assert model.config.pretrained_cfg["mean"] == (0.5,) * 3  # the data's normalization is what it records


def test_another_label_count_initialises_a_new_head_and_says_so(pretrained, caplog):
    folder, saved = pretrained
    with caplog.at_level("WARNING", logger="hf_selective_backprop.models"):
        model = build_model(ModelArguments(model_name_or_path=str(folder)), 10, 16, (0.5,) * 3, (0.25,) * 3)
    assert "a new 10-way head is initialised" in caplog.text
    loaded = model.state_dict()
    assert loaded[HEAD + "weight"].shape == (10, saved[HEAD + "weight"].shape[1])
    backbone = [name for name in saved if not name.startswith(HEAD)]
    assert backbone and all(torch.equal(loaded[name], saved[name]) for name in backbone)


def test_a_model_that_is_no_image_classifier_is_refused_naming_what_it_is(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)).save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match=r"--model_name_or_path .* is a 'gpt2' model .*not an image classifier"):
        build_model(ModelArguments(model_name_or_path=str(tmp_path / "lm")), 5, 16, (0.5,) * 3, (0.25,) * 3)


def test_pretrained_and_model_name_or_path_together_are_refused():
    with pytest.raises(ValueError, match="--pretrained .* --model_name_or_path"):
        ModelArguments(model_name_or_path="somewhere", pretrained=True)


def test_a_fine_tuning_run_resumed_from_its_checkpoint_ends_with_the_uninterrupted_weights(pretrained, tmp_path):
    folder, saved = pretrained
    run = tmp_path / "finetune"
    flags = ["--model_name_or_path", str(folder), "--classes", "5,6,7,8,9", "--num_train_epochs", "2",
             "--sb_strategy", "sb", "--sb_keep", "0.5", "--save_strategy", "epoch", "--augment", "False"]
    uninterrupted = train(run, *flags)
    assert any(not torch.equal(uninterrupted[name], saved[name]) for name in saved)  # it did train
    config = json.loads((run / "config.json").read_text())
    assert config["num_classes"] == 5 and config["label_names"] == ["5", "6", "7", "8", "9"]
    first, last = sorted(run.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    (last / "trainer_state.json").unlink()  # killed while saving the second epoch
    resumed = train(run, *flags, "--resume_from_checkpoint", "True")
    for name, tensor in uninterrupted.items():
        assert torch.equal(resumed[name], tensor), name
