"""Class-aware budgets (NUCS): the budgets and the choice, early_class_budget in a run, the record's `class_budget`
subset, and the refusal of labels that are not one class per example."""

import os

import numpy
import pytest
import torch
from datasets import Dataset
from launch import launch
from test_engine import CountingRows, N, TrainedIds, train
from text_tiny import causal_lm
from tiny import CLASSES, TinyClassifier, make_config, make_dataset
from transformers import TrainerCallback

from hf_selective_backprop import SelectiveBackpropTrainer, record
from hf_selective_backprop.data.noise import stream_generator
from hf_selective_backprop.record.files import write_record
from hf_selective_backprop.record.pruning import _SUBSET_STREAM, dataset_labels, kept_ids
from hf_selective_backprop.record.table import SCORED, ExampleRecord
from hf_selective_backprop.selectors import EarlyPruneSelector, keep_count
from hf_selective_backprop.selectors.class_budget import (
    class_budget_choice,
    class_budgets,
    class_difficulties,
    class_labels,
)
from hf_selective_backprop.selectors.coverage import coverage_choice


def three_classes(sizes=(100, 100, 100), scales=(0.1, 1.0, 3.0), seed=0):
    """Scores of classes whose losses span [0, scale): class 2 the hardest."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.cat([torch.full((size,), c) for c, size in enumerate(sizes)])
    scores = torch.cat([torch.rand(size, generator=generator) * scale for size, scale in zip(sizes, scales,
                                                                                                strict=True)])
    return scores, labels


@pytest.mark.parametrize("seed", range(20))
def test_budgets_sum_to_the_count_stay_within_each_class_and_keep_the_floor(seed):
    generator = torch.Generator().manual_seed(seed)
    classes = int(torch.randint(2, 12, (1,), generator=generator))
    sizes = torch.randint(1, 60, (classes,), generator=generator)
    labels = torch.repeat_interleave(torch.arange(classes), sizes)
    scores = torch.rand(labels.numel(), generator=generator) * torch.rand(classes, generator=generator)[labels] * 5
    for count in (0, 1, classes, labels.numel() // 3, labels.numel() // 2, labels.numel()):
        budgets = class_budgets(scores, labels, count)
        assert int(budgets.sum()) == count
        assert bool((budgets >= 0).all()) and bool((budgets <= sizes).all())
        even = count * sizes.double() / sizes.sum()
        if count >= classes * 4:  # the floor: a quarter of the even share, and one example
            assert bool((budgets >= torch.minimum((0.25 * even).floor().clamp(min=1), sizes.double())).all())
        chosen = class_budget_choice(scores, labels, count, torch.Generator().manual_seed(seed))
        assert chosen.numel() == count == chosen.unique().numel()
        assert torch.equal(torch.bincount(labels[chosen], minlength=classes), budgets)


def test_a_harder_class_keeps_a_larger_share_in_proportion_to_its_difficulty():
    scores, labels = three_classes()
    difficulty = class_difficulties(scores, labels)
    assert difficulty[0] < difficulty[1] < difficulty[2]
    budgets = class_budgets(scores, labels, 90, floor=0.0)
    assert budgets[0] < budgets[1] < budgets[2]
    expected = 90 * difficulty / difficulty.sum()  # equal sizes: budgets proportional to difficulty
    assert (budgets.double() - expected).abs().max() <= 1.0
    # By size x difficulty: a class twice as large at the same difficulty keeps twice as many.
    _, sized = three_classes(sizes=(50, 100, 100))
    flat = torch.cat([torch.linspace(0, 1, 50), torch.linspace(0, 1, 100), torch.linspace(0, 1, 100)])
    assert class_budgets(flat, sized, 50).tolist() == [10, 20, 20]


def test_the_easiest_class_keeps_its_floor_and_a_capped_class_gives_its_excess_to_the_others():
    labels = torch.arange(3).repeat_interleave(100)
    scores = torch.cat([torch.full((100,), 1e-4), torch.full((100,), 2.0), torch.full((100,), 2.0)])
    assert class_budgets(scores, labels, 90).tolist() == [7, 42, 41]  # a quarter of 30; the rest split evenly
    assert class_budgets(scores, labels, 90, floor=0.0).tolist() == [0, 45, 45]
    small_and_hard = torch.cat([torch.zeros(10, dtype=torch.long), torch.ones(290, dtype=torch.long)])
    losses = torch.cat([torch.full((10,), 5.0), torch.full((290,), 0.5)])
    assert class_budgets(losses, small_and_hard, 150).tolist() == [10, 140]  # all 10, not 150 x 50 / 195
    with pytest.raises(ValueError, match="count must be in"):
        class_budgets(losses, small_and_hard, 301)


def test_difficulty_is_winsorized_so_a_few_huge_losses_do_not_make_a_class_hard():
    labels = torch.arange(2).repeat_interleave(100)
    scores = torch.cat([torch.full((100,), 0.5), torch.full((100,), 0.5)])
    scores[100:103] = 100.0  # three likely label issues in class 1
    difficulty = class_difficulties(scores, labels)
    assert difficulty.tolist() == [0.5, 0.5]  # clipped to the class's 95th percentile: 0.5
    assert float(class_difficulties(scores, labels, winsor=0.0)[1]) == pytest.approx(0.5 * 0.97 + 3.0)


def test_inside_a_class_the_choice_is_coverage_and_the_same_generator_state_chooses_the_same():
    scores, labels = three_classes(seed=3)
    first = class_budget_choice(scores, labels, 120, torch.Generator().manual_seed(7))
    assert torch.equal(first, class_budget_choice(scores, labels, 120, torch.Generator().manual_seed(7)))
    assert not torch.equal(first, class_budget_choice(scores, labels, 120, torch.Generator().manual_seed(8)))
    generator = torch.Generator().manual_seed(7)
    by_class = [torch.nonzero(labels == c).flatten() for c in range(3)]
    expected = torch.cat([positions[coverage_choice(scores[positions], int(budget), generator)]
                          for positions, budget in zip(by_class, class_budgets(scores, labels, 120), strict=True)])
    assert torch.equal(first, torch.sort(expected).values)


def test_unlabeled_and_unscored_examples_are_kept_first():
    scores, labels = three_classes()
    labels[:4] = -1  # never trained: no label stored
    scores[150] = float("nan")  # a labeled example without a score
    chosen = class_budget_choice(scores, labels, 60, torch.Generator().manual_seed(0))
    assert chosen.numel() == 60 and set(range(4)) | {150} <= set(chosen.tolist())
    assert set(class_budget_choice(scores, labels, 3, torch.Generator()).tolist()) <= set(range(4))
    with pytest.raises(ValueError, match="labels must be integer class labels"):
        class_budget_choice(scores, labels.float(), 10, torch.Generator())


def test_class_labels_refuse_what_is_not_one_class_per_example():
    assert torch.equal(class_labels(torch.tensor([0, 2, 1]), "--flag"), torch.tensor([0, 2, 1]))
    for labels in (torch.zeros(4, 7, dtype=torch.long), torch.rand(4), torch.rand(4, 3)):
        with pytest.raises(ValueError, match=r"--sb_strategy early_class_budget budgets the kept share class by "
                                             r"class \(NUCS\) and needs one integer class label per example"):
            class_labels(labels, "--sb_strategy early_class_budget")


# ---- early_class_budget in a run -------------------------------------------------------------------------------

def test_the_early_strategy_needs_labels_and_keeps_its_choice():
    scores, labels = three_classes()
    selector = EarlyPruneSelector(keep=0.3, by="class_budget", num_epochs=4)
    assert selector.uses_stored_labels and not EarlyPruneSelector(0.3, "coverage", 4).uses_stored_labels
    with pytest.raises(ValueError, match="plan_epoch needs labels="):
        selector.plan_epoch(scores, torch.Generator(), 1)
    kept = selector.plan_epoch(scores, torch.Generator().manual_seed(0), 1, labels=labels).indices
    assert torch.equal(kept, class_budget_choice(scores, labels, 90, torch.Generator().manual_seed(0)))
    assert torch.equal(selector.plan_epoch(torch.zeros(300), torch.Generator(), 2, labels=labels).indices, kept)


class AtEpochStart(TrainerCallback):
    """The loss and label stores as each epoch starts: before epoch 1, every example's first-epoch loss."""

    def __init__(self, trainer):
        self.trainer, self.stores = trainer, []

    def on_epoch_begin(self, args, state, control, **kwargs):
        engine = self.trainer.engine
        self.stores.append((engine.store.lookup(torch.arange(N))[0].clone(), engine.labels.lookup(torch.arange(N))))


class Recorded(TrainedIds):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.starts = AtEpochStart(self)
        self.add_callback(self.starts)


def test_early_class_budget_trains_the_class_budgets_of_the_first_epochs_losses(output_dir):
    rows = CountingRows()
    trainer = train(output_dir, rows, trainer_cls=Recorded, sb_strategy="early_class_budget", sb_keep=0.25,
                    num_train_epochs=3)
    losses, labels = trainer.starts.stores[1]
    assert labels.tolist() == [int(label) for label in rows.y]  # each example's label, stored beside its loss
    seed = trainer.args.seed
    expected = class_budget_choice(losses, labels, keep_count(0.25, N), torch.Generator().manual_seed(
        seed * 1_000_033 + 1))  # the engine's plan generator for epoch 1
    assert torch.equal(trainer.selector.kept, expected)
    kept = keep_count(0.25, N)
    assert int((rows.loads == 3).sum()) == kept and int((rows.loads == 1).sum()) == N - kept
    assert set(torch.nonzero(rows.loads == 3).flatten().tolist()) == set(expected.tolist())
    assert trainer.sb_stats["selection_forwards"] == 0 and trainer.sb_stats["backwards"] == N + 2 * kept
    assert len(set(labels[expected].tolist())) == CLASSES  # every class keeps some


def test_a_run_resumed_inside_the_first_epoch_budgets_with_the_labels_it_stored_before(output_dir, tmp_path):
    settings = dict(sb_strategy="early_class_budget", sb_keep=0.25, num_train_epochs=2)
    full = train(output_dir, **settings)
    partial = str(tmp_path / "partial")
    train(partial, save_strategy="steps", save_steps=5, **settings)  # step 5 of 24: inside the first epoch
    resumed = train(str(tmp_path / "resumed"), resume=os.path.join(partial, "checkpoint-5"), **settings)
    assert torch.equal(resumed.selector.kept, full.selector.kept)
    for ours, theirs in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_two_processes_store_every_ranks_labels_and_train_one_subset(tmp_path):
    ranks = launch(tmp_path, ["--strategy", "early_class_budget", "--keep", "0.5", "--epochs", "3"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    # Each rank trains half of each epoch: the labels of the other half came with the gathered losses.
    assert torch.equal(ranks[0]["labels"], ranks[1]["labels"]) and bool((ranks[0]["labels"] >= 0).all())
    assert torch.equal(ranks[0]["selector_state"]["kept"], ranks[1]["selector_state"]["kept"])
    assert len(set(ranks[0]["labels"][ranks[0]["selector_state"]["kept"]].tolist())) > 1


def test_a_model_with_token_level_labels_is_refused_when_the_trainer_is_built(output_dir):
    args = make_config(output_dir, sb_strategy="early_class_budget", sb_keep=0.5)
    with pytest.raises(ValueError, match=r"--sb_strategy early_class_budget budgets the kept share class by class "
                                         r"\(NUCS\).*this run has a causal-lm model.*--sb_strategy early_coverage"):
        SelectiveBackpropTrainer(model=causal_lm(), args=args, train_dataset=make_dataset(16))


class PerRowTargets(torch.utils.data.Dataset):
    """Rows whose labels are a (1,) vector each: no class, though the model's loss reads them."""

    def __init__(self, n: int = 16):
        self.data = make_dataset(n)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        row = self.data[i]
        return {"pixel_values": row["pixel_values"], "labels": row["labels"].reshape(1)}


def test_labels_that_are_not_one_class_per_example_are_refused_at_the_first_step(output_dir):
    def per_example(outputs, labels):
        return torch.nn.functional.cross_entropy(outputs["logits"], labels[:, 0], reduction="none")

    class Flattening(TinyClassifier):
        def forward(self, pixel_values, labels=None):
            return super().forward(pixel_values, None if labels is None else labels[:, 0])

    trainer = SelectiveBackpropTrainer(model=Flattening(), args=make_config(
        output_dir, sb_strategy="early_class_budget", sb_keep=0.5), train_dataset=PerRowTargets(),
        per_example_loss_func=per_example)
    with pytest.raises(ValueError, match=r"this run has labels of dtype torch.int64 and shape \(8, 1\)"):
        trainer.train()


# ---- the record's class_budget subset --------------------------------------------------------------------------

def record_and_labels(n: int = 300):
    scores, labels = three_classes(sizes=(n // 3,) * 3)
    table = Dataset.from_dict({"index": list(range(n)), "mean_loss": scores.tolist()})
    return table, scores, labels


def test_the_records_class_budget_subset_is_the_functions_choice():
    table, scores, labels = record_and_labels()
    ids = numpy.arange(300)
    chosen = kept_ids(table, ids, keep=0.3, by="class_budget", seed=4, id_column="index", labels=labels.numpy())
    expected = class_budget_choice(scores.double(), labels, 90, stream_generator(_SUBSET_STREAM, 4))
    assert chosen.tolist() == expected.tolist()
    assert numpy.bincount(labels.numpy()[chosen]).tolist() == class_budgets(scores, labels, 90).tolist()
    with pytest.raises(ValueError, match="by='class_budget' budgets the subset by class: give labels"):
        kept_ids(table, ids, keep=0.3, by="class_budget", seed=4, id_column="index")
    data = Dataset.from_dict({"index": list(range(300)), "label": labels.tolist()})
    assert record.prune(data, table, keep=0.3, by="class_budget", seed=4)["index"] == chosen.tolist()


def test_sb_subset_by_class_budget_trains_on_the_functions_choice(tmp_path):
    n = 96
    data = make_dataset(n)
    labels = torch.tensor(data["labels"])
    scores = torch.rand(n, generator=torch.Generator().manual_seed(0)) * (1 + labels)
    path = str(tmp_path / "record.parquet")
    table = ExampleRecord()
    table.apply(torch.arange(n), scores, torch.tensor([SCORED] * n), torch.zeros(n))
    write_record(table, path, "index")
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=data, args=make_config(
        str(tmp_path / "out"), sb_strategy="none", sb_subset_from=path, sb_subset_keep=0.25,
        sb_subset_by="class_budget"))
    expected = class_budget_choice(scores.double(), labels, 24, stream_generator(_SUBSET_STREAM, trainer.args.seed))
    assert list(trainer.train_dataset["index"]) == expected.tolist()


def test_token_level_labels_are_refused_for_the_records_class_budget_subset():
    tokens = Dataset.from_dict({"index": [0, 1], "labels": [[1, 2, 3], [4, 5]]})
    with pytest.raises(ValueError, match=r"--sb_subset_by class_budget budgets the kept share class by class"):
        dataset_labels(tokens)
    assert dataset_labels(Dataset.from_dict({"label": [2, 0, 1]})).tolist() == [2, 0, 1]
