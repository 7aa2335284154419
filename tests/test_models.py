"""timm models through TimmWrapper: build, save, reload and preprocess offline."""

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification, TimmWrapperForImageClassification

from hf_selective_backprop.data import BatchTransform
from hf_selective_backprop.models import ModelArguments, build_model

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
NAMES = [f"class_{i}" for i in range(10)]


@pytest.mark.parametrize("architecture", ["resnet18", "vit_tiny_patch16_224"])
def test_build_save_reload_gives_identical_logits(architecture, tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelArguments(model=architecture), 10, 32, MEAN, STD, label_names=NAMES).eval()
    assert isinstance(model, TimmWrapperForImageClassification)
    assert model.config.id2label[3] == "class_3" and model.config.label2id["class_3"] == 3
    pixels, labels = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    out = model(pixel_values=pixels, labels=labels)
    assert out.logits.shape == (2, 10) and out.loss.ndim == 0

    model.save_pretrained(tmp_path)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, TimmWrapperForImageClassification)
    assert reloaded.config.id2label == model.config.id2label
    with torch.no_grad():
        assert torch.equal(reloaded(pixel_values=pixels).logits, model(pixel_values=pixels).logits)


def test_fixed_size_models_are_built_for_the_image_size():
    model = build_model(ModelArguments(model="vit_tiny_patch16_224"), 10, 32, MEAN, STD)
    assert model.config.model_args["img_size"] == (32, 32)
    assert model.timm_model.patch_embed.img_size == (32, 32)
    resnet = build_model(ModelArguments(model="resnet18"), 10, 32, MEAN, STD)
    assert "img_size" not in resnet.config.model_args


def test_image_processor_reloads_offline_and_matches_training_normalization(tmp_path):
    model = build_model(ModelArguments(model="resnet18"), 10, 32, MEAN, STD, label_names=NAMES)
    model.save_pretrained(tmp_path)
    processor = AutoImageProcessor.from_pretrained(tmp_path)
    assert processor.data_config["input_size"] == (3, 32, 32)
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    processed = processor(Image.fromarray(image))["pixel_values"]
    ours = BatchTransform(MEAN, STD)(torch.from_numpy(image).permute(2, 0, 1)[None])
    assert processed.shape == (1, 3, 32, 32)
    assert torch.allclose(processed, ours, atol=1e-5)


def test_grayscale_inputs_and_dropout_are_configured():
    model = build_model(ModelArguments(model="resnet18", drop_rate=0.25), 3, (28, 28), (0.13,), (0.31,), in_chans=1)
    assert model.config.model_args == {"in_chans": 1, "drop_rate": 0.25}
    assert model.config.pretrained_cfg["input_size"] == (1, 28, 28)
    assert model.timm_model.drop_rate == 0.25
    assert model(pixel_values=torch.randn(2, 1, 28, 28)).logits.shape == (2, 3)
    assert model.config.id2label == {0: "0", 1: "1", 2: "2"}


def test_unknown_architecture_names_the_flag_and_suggests():
    with pytest.raises(ValueError, match=r"--model 'resnet181'.*resnet18.*timm.list_models"):
        build_model(ModelArguments(model="resnet181"), 10, 32, MEAN, STD)
    with pytest.raises(ValueError, match="mean/std need 1"):
        build_model(ModelArguments(), 10, 32, MEAN, STD, in_chans=1)


def test_pretrained_weights_are_loaded_into_the_wrapper(monkeypatch):
    # Offline stand-in for the Hub download: the same call, with pretrained weights faked.
    import timm

    created = {}
    real_create = timm.create_model

    def fake_create(name, pretrained=False, **kwargs):
        if not pretrained:  # TimmWrapper's own build
            return real_create(name, **kwargs)
        assert kwargs == {"num_classes": 10, "in_chans": 1}
        torch.manual_seed(123)
        created["model"] = real_create(name, pretrained=False, **kwargs)
        return created["model"]

    monkeypatch.setattr(timm, "create_model", fake_create)
    model = build_model(ModelArguments(model="resnet18", pretrained=True), 10, 32, (0.5,), (0.5,), in_chans=1)
    expected = created["model"].state_dict()
    assert expected.keys() == model.timm_model.state_dict().keys()
    for name, tensor in model.timm_model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


@pytest.mark.parametrize("rate", [-0.1, 1.0, float("nan"), float("inf")])
def test_drop_rate_outside_0_1_is_refused_before_any_model_is_built(rate):
    with pytest.raises(ValueError, match=rf"--drop_rate must be in \[0, 1\), got {rate!r}"):
        ModelArguments(drop_rate=rate)
    assert ModelArguments(drop_rate=0.5).drop_rate == 0.5
