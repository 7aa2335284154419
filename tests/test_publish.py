"""Publishing to the Hub, offline: `HfApi` is replaced where the network begins, and the files
that `push_to_hub` would upload are checked (the card, weights, config, tokenizer, sb_stats.json)."""

import concurrent.futures
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
)

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "movie", "plot", "the", "a"]


class FakeHub:
    """Records every repository created and every folder upload, with the bytes it would send."""

    def __init__(self):
        self.repos, self.uploads = [], []

    def create_repo(self, api, repo_id, **kwargs):
        self.repos.append(repo_id)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, api, *, repo_id, folder_path, commit_message=None, run_as_future=False, **kwargs):
        # The same filter upload_folder applies before hashing and sending the files.
        ignore = [*(kwargs.get("ignore_patterns") or []), *DEFAULT_IGNORE_PATTERNS]
        folder = Path(folder_path)
        paths = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
        kept = filter_repo_objects(paths, allow_patterns=kwargs.get("allow_patterns"), ignore_patterns=ignore)
        prefix = f"{kwargs['path_in_repo']}/" if kwargs.get("path_in_repo") else ""
        files = {prefix + path: (folder / path).read_bytes() for path in kept}
        self.uploads.append({"repo_id": repo_id, "message": commit_message, "files": files})
        info = CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message=commit_message or "",
            commit_description="", oid="0",
        )
        if not run_as_future:
            return info
        future = concurrent.futures.Future()
        future.set_result(info)
        return future

    def card(self, upload) -> str:
        return upload["files"]["README.md"].decode()


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: fake.create_repo(api, repo_id, **kw))
    monkeypatch.setattr(HfApi, "upload_folder", lambda api, **kw: fake.upload_folder(api, **kw))
    return fake


def tiny_text_classifier(tmp_path):
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=2,
    )
    generator = torch.Generator().manual_seed(0)
    picks = torch.randint(0, 6, (96, 4), generator=generator)
    sentences = [" ".join(WORDS[int(i)] for i in row) for row in picks]
    labels = [int((row < 3).sum() >= 2) for row in picks]
    encoded = tokenizer(sentences, padding="max_length", max_length=8)
    data = Dataset.from_dict({**encoded, "labels": labels})
    return BertForSequenceClassification(config), tokenizer, data


def test_trainer_push_to_hub_uploads_the_selective_backprop_card(tmp_path, hub):
    model, tokenizer, data = tiny_text_classifier(tmp_path)
    output_dir = tmp_path / "tiny-text-sb"
    args = SelectiveBackpropConfig(
        output_dir=str(output_dir), sb_strategy="sb", sb_keep=0.5, per_device_train_batch_size=8,
        num_train_epochs=2, eval_strategy="epoch", save_strategy="epoch", use_cpu=True, report_to="none",
        disable_tqdm=True, hub_model_id="you/tiny-text-sb", seed=0,
    )
    trainer = SelectiveBackpropTrainer(
        model=model, args=args, train_dataset=data, eval_dataset=data.select(range(32)), processing_class=tokenizer,
        compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())},
    )
    trainer.train()
    assert list(output_dir.glob("checkpoint-*"))  # saved, but not for upload

    trainer.push_to_hub(dataset=str(tmp_path / "sst2"), eval_split="validation")

    assert hub.repos == ["you/tiny-text-sb"]
    (upload,) = hub.uploads
    files = upload["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md",
            "sb_stats.json", "training_args.bin"} <= set(files)
    assert not [path for path in files if path.startswith("checkpoint-")]
    assert json.loads(files["sb_stats.json"])["backwards"] == trainer.sb_stats["backwards"]

    card_text = hub.card(upload)
    assert str(tmp_path) not in card_text and str(ROOT) not in card_text
    card = ModelCard(card_text)
    assert card.data.pipeline_tag == "text-classification" and card.data.datasets == ["stanfordnlp/sst2"]
    assert "selective-backprop" in card.data.tags and "generated_from_trainer" in card.data.tags
    accuracy = [log["eval_accuracy"] for log in trainer.state.log_history if "eval_accuracy" in log][-1]
    (result,) = card.data.eval_results
    assert (result.dataset_split, result.metric_value) == ("validation", accuracy)
    assert "Strategy: `sb`" in card_text and "| `sb_keep` | `0.5` |" in card_text
    assert f"| backward passes (examples) | {trainer.sb_stats['backwards']:,} |" in card_text
    assert "- learning_rate: 5e-05" in card_text  # the Trainer's own hyperparameter section
    assert 'pipeline("text-classification", model="you/tiny-text-sb")' in card_text

    # What was uploaded is a usable repository on its own.
    repo = tmp_path / "downloaded"
    for path, content in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(content)
    reloaded = AutoModelForSequenceClassification.from_pretrained(repo).eval()
    inputs = AutoTokenizer.from_pretrained(repo)(["good great movie", "awful plot"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, trainer.model.eval()(**inputs).logits)


@pytest.mark.parametrize("hub_strategy", ["every_save", "checkpoint"])
def test_train_script_pushes_the_card_and_checkpoints_only_when_asked(tmp_path, hub, monkeypatch, hub_strategy):
    output_dir = tmp_path / "digits-sb"
    monkeypatch.setattr(sys, "argv", [
        "train.py", "--dataset", "digits", "--model", "resnet18", "--image_size", "16", "--max_train_samples", "128",
        "--max_eval_samples", "64", "--per_device_train_batch_size", "32", "--num_train_epochs", "1",
        "--output_dir", str(output_dir), "--use_cpu", "--disable_tqdm", "true", "--push_to_hub",
        "--hub_model_id", "you/digits-sb", "--hub_strategy", hub_strategy, "--sb_strategy", "sb",
    ])
    runpy.run_path(str(ROOT / "scripts" / "train.py"), run_name="__main__")

    final = hub.uploads[-1]
    assert final["message"] == "sb on digits" and final["repo_id"] == "you/digits-sb"
    files = final["files"]
    assert {"model.safetensors", "config.json", "README.md", "sb_stats.json"} <= set(files)
    # timm models keep their image processor settings in config.json.
    assert json.loads(files["config.json"])["pretrained_cfg"]["input_size"] == [3, 16, 16]
    card = hub.card(final)
    assert str(tmp_path) not in card and "datasets:" not in card  # digits has no Hub id
    assert "Strategy: `sb`" in card and 'pipeline("image-classification", model="you/digits-sb")' in card

    uploaded = {path for upload in hub.uploads for path in upload["files"]}
    assert not [path for path in uploaded if path.startswith("checkpoint-")]
    assert any(path.startswith("last-checkpoint/") for path in uploaded) == (hub_strategy == "checkpoint")
    repo = tmp_path / "downloaded"
    for path, content in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_bytes(content)
    assert AutoModelForImageClassification.from_pretrained(repo).config.architecture == "resnet18"


def test_the_card_of_a_subset_run_from_a_local_record_holds_no_local_path(tmp_path, hub):
    model, tokenizer, data = tiny_text_classifier(tmp_path)
    common = dict(per_device_train_batch_size=8, num_train_epochs=2, use_cpu=True, report_to="none",
                  disable_tqdm=True, save_strategy="no", seed=0)
    first = SelectiveBackpropConfig(output_dir=str(tmp_path / "first"), sb_strategy="none", **common)
    SelectiveBackpropTrainer(model=model, args=first, train_dataset=data, processing_class=tokenizer).train()
    model, tokenizer, data = tiny_text_classifier(tmp_path)
    args = SelectiveBackpropConfig(output_dir=str(tmp_path / "subset"), sb_subset_from=str(tmp_path / "first"),
                                   sb_subset_keep=0.5, hub_model_id="you/tiny-subset", **common)
    trainer = SelectiveBackpropTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    trainer.push_to_hub()
    card_text = hub.card(hub.uploads[-1])
    assert str(tmp_path) not in card_text
    assert "| `sb_subset_from` | `first` |" in card_text and "Strategy: `none`" in card_text
