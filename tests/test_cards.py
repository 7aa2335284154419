"""Model cards: front matter the Hub can parse, every sb_* setting, accuracy and savings."""

from types import SimpleNamespace

import pytest
from huggingface_hub import ModelCard

from hf_selective_backprop.cards import STATS_KEYS, TEMPLATE_PATH, render_model_card, sb_settings
from hf_selective_backprop.config import SelectiveBackpropConfig

STATS = {
    "selection_forwards": 150_000,
    "training_forwards": 50_000,
    "backwards": 50_000,
    "optimizer_steps": 390,
    "kept_fraction": 1 / 3,
    "train_seconds": 412.5,
    "examples_seen": 150_000,
}


def test_template_is_found_at_the_repository_root():
    assert TEMPLATE_PATH.is_file() and TEMPLATE_PATH.parent.name == "model_cards"


def test_card_lists_every_sb_setting_accuracy_and_savings(tmp_path):
    args = SelectiveBackpropConfig(output_dir=str(tmp_path / "run"), num_train_epochs=3, report_to="none")
    path = render_model_card(
        tmp_path / "run",
        args,
        architecture="resnet18",
        dataset="uoft-cs/cifar10",
        stats=STATS,
        accuracy=0.9123,
        num_train_examples=50_000,
    )
    text = path.read_text()
    assert path.name == "README.md"
    settings = sb_settings(args)
    assert "sb_strategy" in settings and len(settings) > 5
    for name, value in settings.items():
        assert f"| `{name}` | `{value}` |" in text
    assert f"Strategy: `{args.sb_strategy}`" in text
    assert "| accuracy (test) | 91.23 % |" in text
    assert "| backward passes vs a full pass | 33.33 % of 150,000 |" in text
    assert "| selection forwards (examples) | 150,000 |" in text
    assert "| kept fraction | 33.33 % |" in text
    assert "| training wall time (s) | 412.50 |" in text
    assert "`resnet18`" in text and "**uoft-cs/cifar10**" in text

    card = ModelCard.load(path)
    assert card.data.library_name == "transformers"
    assert card.data.tags == ["image-classification", "timm", "selective-backprop"]
    assert card.data.datasets == ["uoft-cs/cifar10"] and card.data.metrics == ["accuracy"]
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("accuracy", 0.9123, "test")


def test_missing_stats_read_na_and_full_pass_falls_back_to_epochs(tmp_path):
    args = SimpleNamespace(sb_strategy="uniform", sb_keep=0.5, sb_note="a|b", num_train_epochs=2, lr=0.1)
    path = render_model_card(
        tmp_path,
        args,
        architecture="vit_tiny_patch16_224",
        dataset="digits",
        stats={"backwards": 1437},
        num_train_examples=1437,
        model_name="tiny",
    )
    text = path.read_text()
    assert text.startswith("---\n")
    assert "| accuracy (test) | n/a |" in text and "| kept fraction | n/a |" in text
    assert text.count("| n/a |") == len(STATS_KEYS) - 1 + 1  # every other stat, and the accuracy
    assert "| backward passes vs a full pass | 50.00 % of 2,874 |" in text
    assert "| `sb_note` | `a\\|b` |" in text and "`lr`" not in text
    card = ModelCard.load(path)
    assert card.data.eval_results is None  # no accuracy, no model-index entry


def test_missing_template_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model card template not found"):
        render_model_card(tmp_path, SimpleNamespace(), architecture="a", dataset="d", stats={}, template=tmp_path / "x")
