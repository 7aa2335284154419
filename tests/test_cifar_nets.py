"""The 32x32-native networks: timm builds them by name, TimmWrapper wraps them, checkpoints reload (in a fresh
process too, through from_pretrained and the model card's snippet)."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import torch
from transformers import AutoModelForImageClassification

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.models import ModelArguments, build_model, load_classifier

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


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A cifar_convnet_half saved by the trainer with its model card, the logits it gives, and their inputs."""
    folder = tmp_path_factory.mktemp("cifar-convnet-half")
    torch.manual_seed(0)
    model = build_model(ModelArguments(model="cifar_convnet_half"), 10, 32, (0.5,) * 3, (0.25,) * 3).eval()
    args = SelectiveBackpropConfig(output_dir=str(folder), report_to="none", use_cpu=True)
    trainer = SelectiveBackpropTrainer(model=model, args=args)
    trainer.save_model()
    trainer.create_model_card()
    pixels = torch.randn(3, 3, 32, 32)
    torch.save({"pixels": pixels, "logits": model(pixel_values=pixels).logits}, folder / "expected.pt")
    return folder


def test_a_fresh_process_that_imports_the_package_reloads_the_network_with_from_pretrained(saved_run):
    result = _run(f"""
        import torch
        import hf_selective_backprop  # registers the package's networks in timm, as its docs say
        from transformers import AutoModelForImageClassification

        model = AutoModelForImageClassification.from_pretrained({str(saved_run)!r}).eval()
        expected = torch.load({str(saved_run / "expected.pt")!r})
        torch.testing.assert_close(model(pixel_values=expected["pixels"]).logits, expected["logits"])
        print("ok")
    """, saved_run)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_the_model_cards_snippet_loads_the_network_in_a_fresh_process(saved_run):
    card = (saved_run / "README.md").read_text()
    snippet = re.search(r"## Use\n\n```python\n(.*?)```", card, re.DOTALL).group(1)
    assert snippet.startswith("import hf_selective_backprop  # registers cifar_convnet_half in timm")
    snippet = re.sub(r'model="[^"]*"', f"model={str(saved_run)!r}", snippet)
    result = _run(snippet + textwrap.dedent("""
        from PIL import Image
        print(pipe(Image.new("RGB", (32, 32)))[0]["label"])
    """), saved_run)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] in {str(label) for label in range(10)}


def test_a_card_of_a_timm_architecture_needs_no_import_of_the_package(tmp_path):
    model = build_model(ModelArguments(model="resnet18"), 10, 32, (0.5,) * 3, (0.25,) * 3)
    trainer = SelectiveBackpropTrainer(model=model, args=SelectiveBackpropConfig(output_dir=str(tmp_path),
                                                                                 report_to="none", use_cpu=True))
    assert "import hf_selective_backprop" not in Path(trainer.create_model_card()).read_text()


def test_a_saved_network_no_code_registered_is_named_with_the_package_not_upgrade_timm(saved_run, tmp_path):
    config = json.loads((saved_run / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architecture": "my_own_net"}))
    with pytest.raises(ValueError, match=r"'my_own_net', which neither timm .* nor hf_selective_backprop \(its "
                                         r"networks: cifar_convnet, cifar_convnet_half, .*\) registers: import the"):
        load_classifier(str(tmp_path), ["a", "b"], 32, (0.5,) * 3, (0.25,) * 3)
