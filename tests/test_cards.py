"""Model cards: front matter the Hub can parse, every sb_* setting, accuracy, savings, no local paths."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import ModelCard
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.card_settings import sb_settings
from hf_selective_backprop.cards import (
    STATS_KEYS,
    TEMPLATE_PATH,
    hub_dataset_id,
    render_model_card,
)
from hf_selective_backprop.config import SelectiveBackpropConfig

ROOT = Path(__file__).resolve().parents[1]
STATS = {
    "selection_forwards": 150_000,
    "training_forwards": 50_000,
    "backwards": 50_000,
    "optimizer_steps": 390,
    "kept_fraction": 1 / 3,
    "train_seconds": 412.5,
    "examples_seen": 150_000,
}


def test_template_ships_in_the_package_and_model_cards_shows_the_same_file():
    import hf_selective_backprop

    assert TEMPLATE_PATH.is_file() and TEMPLATE_PATH.parent.parent == Path(hf_selective_backprop.__file__).parent
    assert (ROOT / "model_cards" / "selective_backprop.md").resolve() == TEMPLATE_PATH.resolve()


def test_card_lists_the_settings_that_applied_accuracy_and_savings(tmp_path):
    args = SelectiveBackpropConfig(output_dir=str(tmp_path / "run"), num_train_epochs=3, report_to="none",
                                   sb_strategy="sb", sb_keep=0.5, sb_subset_from=str(tmp_path / "first-run"),
                                   sb_subset_keep=0.7)
    path = render_model_card(
        tmp_path / "run",
        args,
        architecture="resnet18",
        model_class="TimmWrapperForImageClassification",
        dataset="uoft-cs/cifar10",
        stats=STATS,
        accuracy=0.9123,
        eval_split="test",
        num_train_examples=50_000,
        tags=["timm"],
        hyperparameters={"learning_rate": 0.1},
    )
    text = path.read_text()
    assert path.name == "README.md"
    applied = {"sb_strategy": "sb", "sb_keep": 0.5, "sb_subset_from": "first-run", "sb_subset_keep": 0.7}
    for name, value in applied.items():
        assert f"| `{name}` | `{value}` |" in text
    untouched = [name for name in sb_settings(args) if name not in applied]
    assert len(untouched) > 20 and not [name for name in untouched if f"| `{name}` |" in text]
    assert str(tmp_path) not in text  # a local path never reaches a card that is pushed
    assert f"Strategy: `{args.sb_strategy}`" in text
    assert "| accuracy (test) | 91.23 % |" in text
    assert "| backward passes vs a full pass | 33.33 % of 150,000 |" in text
    assert "| selection forwards (examples) | 150,000 |" in text
    assert "every batch is\nfirst scored with a forward pass" in text
    assert "| kept fraction | 33.33 % |" in text
    assert "| training wall time (s) | 412.50 |" in text
    assert "- learning_rate: 0.1" in text
    assert "`resnet18` (`TimmWrapperForImageClassification`)" in text
    assert "[uoft-cs/cifar10](https://huggingface.co/datasets/uoft-cs/cifar10)" in text

    card = ModelCard.load(path)
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    assert card.data.tags == ["selective-backprop", "image-classification", "timm"]
    assert card.data.datasets == ["uoft-cs/cifar10"] and card.data.metrics == ["accuracy"]
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("accuracy", 0.9123, "test")


def test_text_card_from_a_local_copy_names_the_hub_dataset_and_no_path(tmp_path):
    folder = tmp_path / "sst2"
    folder.mkdir()
    path = render_model_card(
        tmp_path / "out",
        SimpleNamespace(sb_strategy="topk", sb_keep=0.25),
        architecture="bert",
        task="text-classification",
        tags=["sentiment"],
        dataset=folder,
        stats={"backwards": 10, "examples_seen": 40},
        accuracy=0.5,
        model_name="bert-sst2-topk",
        base_model=str(tmp_path / "my-bert"),  # a local starting point: no base_model
    )
    text = path.read_text()
    assert str(tmp_path) not in text
    card = ModelCard.load(path)
    assert card.data.pipeline_tag == "text-classification" and card.data.datasets == ["stanfordnlp/sst2"]
    assert card.data.base_model is None
    assert card.data.tags == ["selective-backprop", "text-classification", "sentiment"]
    assert card.data.eval_results[0].task_type == "text-classification"
    assert 'pipeline("text-classification", model="bert-sst2-topk")' in text


def test_missing_stats_read_na_and_unknown_dataset_is_left_out(tmp_path):
    args = SimpleNamespace(sb_strategy="uniform", sb_keep=0.5, sb_note="a|b", num_train_epochs=2, lr=0.1)
    path = render_model_card(
        tmp_path,
        args,
        architecture="vit_tiny_patch16_224",
        dataset="sklearn.datasets.load_digits",
        stats={"backwards": 1437},
        accuracy=0.25,
        num_train_examples=1437,
        model_name="tiny",
    )
    text = path.read_text()
    assert text.startswith("---\n")
    assert "| kept fraction | n/a |" in text and "| backward passes vs a full pass | n/a of n/a |" in text
    # Every stat but the backwards; the reference model's rows appear only for a 'rholoss' run, the budget's
    # only with --sb_budget.
    shown = [key for key in STATS_KEYS if not key.startswith("reference_") and key != "budget_spent"]
    assert text.count("| n/a |") == len(shown) - 1
    assert "budget" not in text
    assert "reference" not in text.lower()
    assert "| `sb_note` | `a\\|b` |" in text and "`lr`" not in text
    card = ModelCard.load(path)
    assert card.data.datasets is None and "datasets" not in text
    assert card.data.eval_results is None  # an accuracy without a Hub dataset has no model-index entry


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("cifar10", "uoft-cs/cifar10"),
        ("CIFAR-10", "uoft-cs/cifar10"),
        ("uoft-cs/cifar10", "uoft-cs/cifar10"),
        ("/data/copies/mnist", "ylecun/mnist"),
        ("~/data/ylecun-mnist", "ylecun/mnist"),
        ("./sst2", "stanfordnlp/sst2"),
        ("someone/their-data", "someone/their-data"),
        ("/data/copies/my-photos", None),
        ("sklearn.datasets.load_digits", None),
        ("digits", None),
        (None, None),
    ],
)
def test_hub_dataset_id_maps_known_names_and_folders_and_drops_local_paths(source, expected):
    assert hub_dataset_id(source) == expected


def test_unknown_task_and_missing_template_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="task 'translation'.*text-generation"):
        render_model_card(tmp_path, SimpleNamespace(), architecture="a", stats={}, task="translation")
    with pytest.raises(FileNotFoundError, match="model card template not found"):
        render_model_card(tmp_path, SimpleNamespace(), architecture="a", stats={}, template=tmp_path / "x")


def _trained(output_dir, train_dataset=None, **overrides):
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(),
        args=make_config(output_dir, **overrides),
        train_dataset=train_dataset if train_dataset is not None else make_dataset(),
    )
    trainer.train()
    return trainer


def test_create_model_card_from_python_writes_the_selective_backprop_card(tmp_path):
    output_dir = tmp_path / "tiny-sb"
    trainer = _trained(str(output_dir), sb_strategy="sb", sb_keep=0.5)
    assert trainer.create_model_card(dataset=str(tmp_path / "cifar10")) == output_dir / "README.md"
    text = (output_dir / "README.md").read_text()
    assert str(tmp_path) not in text
    assert "Strategy: `sb`" in text and "| `sb_keep` | `0.5` |" in text
    stats = trainer.sb_stats
    assert f"| backward passes (examples) | {stats['backwards']:,} |" in text
    assert f"| selection forwards (examples) | {stats['selection_forwards']:,} |" in text
    assert "The following hyperparameters were used during training:" in text and "- num_epochs: 2" in text
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.datasets == ["uoft-cs/cifar10"] and "generated_from_trainer" in card.data.tags


def test_plain_run_card_takes_its_savings_from_the_trainer_state(tmp_path):
    dataset = make_dataset()
    dataset.info.dataset_name = "mnist"  # as `load_dataset` records it for a Hub repo or a local copy
    trainer = _trained(str(tmp_path / "plain"), train_dataset=dataset, sb_strategy="none")
    trainer.create_model_card()
    text = (tmp_path / "plain" / "README.md").read_text()
    assert f"| backward passes vs a full pass | 100.00 % of {2 * len(dataset):,} |" in text
    assert "| selection forwards (examples) | 0 |" in text and "Strategy: `none`" in text
    assert "without selection: the traditional baseline" in text
    assert f"| optimizer steps | {trainer.state.global_step} |" in text
    assert ModelCard.load(tmp_path / "plain" / "README.md").data.datasets == ["ylecun/mnist"]


def test_a_strategy_without_selection_forwards_is_not_described_as_scoring_every_batch(tmp_path):
    args = SelectiveBackpropConfig(output_dir=str(tmp_path / "run"), report_to="none", sb_strategy="early_prune",
                                   sb_keep=0.5)
    text = render_model_card(tmp_path / "run", args, architecture="resnet18",
                             stats={**STATS, "selection_forwards": 0}).read_text()
    assert "so no selection forward ran" in text and "first scored with a forward pass" not in text
    assert "`early_prune` strategy" in text
