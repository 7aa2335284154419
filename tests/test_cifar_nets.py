"""The 32x32-native networks: timm builds them by name, TimmWrapper wraps them, checkpoints reload."""

import pytest
import timm
import torch
from transformers import AutoModelForImageClassification

from hf_selective_backprop.models import ModelArguments, build_model

# Parameter counts of the published layouts: ResNet-20 (He et al., 2016: 0.27 M) and airbench94's network
# (~1.97 M at full width; this one has no whitening-layer freeze but the same shapes).
PARAMETERS = {
    "cifar_resnet20": (0.26e6, 0.28e6),
    "cifar_resnet20_w2": (1.05e6, 1.12e6),
    "cifar_convnet": (1.9e6, 2.0e6),
    "cifar_convnet_half": (0.48e6, 0.52e6),
}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_registered_in_timm_with_the_layouts_parameter_count_and_32x32_logits(name):
    assert timm.is_model(name)
    model = timm.create_model(name, num_classes=10)
    low, high = PARAMETERS[name]
    assert low <= sum(p.numel() for p in model.parameters()) <= high
    logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    # timm's head interface: features, pre-logits, a new classifier.
    features = model.forward_features(torch.randn(2, 3, 32, 32))
    assert features.shape[1] == model.num_features
    assert model.forward_head(features, pre_logits=True).shape == (2, model.num_features)
    model.reset_classifier(4)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 4)
    assert model.get_classifier().out_features == 4


def test_resnet20_keeps_full_resolution_until_its_second_stage():
    model = timm.create_model("cifar_resnet20", num_classes=10)
    # No 4x stem: the first stage sees 32x32 maps, the last 8x8.
    assert model.stem(torch.randn(1, 3, 32, 32)).shape[-2:] == (32, 32)
    assert model.forward_features(torch.randn(1, 3, 32, 32)).shape[-2:] == (8, 8)


def test_grayscale_and_dropout_are_passed_through():
    model = timm.create_model("cifar_convnet_half", num_classes=3, in_chans=1, drop_rate=0.2)
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    assert model.head_drop.p == 0.2


def test_no_pretrained_weights_is_said_by_name():
    with pytest.raises(ValueError, match="cifar_resnet20 has no pretrained weights"):
        timm.create_model("cifar_resnet20", pretrained=True)


def test_wrapped_model_saves_and_reloads_with_identical_logits(tmp_path):
    torch.manual_seed(0)
    model = build_model(
        ModelArguments(model="cifar_convnet_half"), 10, 32, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    ).eval()
    pixels = torch.randn(3, 3, 32, 32)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert torch.equal(model(pixel_values=pixels).logits, reloaded(pixel_values=pixels).logits)
    assert reloaded.config.pretrained_cfg["input_size"] == [3, 32, 32]
