"""Early pruning in one run: the first epoch on everything, then a fixed subset ranked by first-epoch loss (or a
random one, its control) for every later epoch."""

import pytest
import torch
from test_engine import CountingRows, N, TrainedIds, resume_inside_a_planned_epoch, train
from tiny import TinyClassifier, make_config, make_dataset
from transformers import TrainerCallback

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.selectors import EarlyPruneSelector, keep_count


def test_plan_waits_for_losses_then_keeps_the_highest_and_never_changes():
    selector = EarlyPruneSelector(keep=0.3, by="loss", num_epochs=4)
    generator = torch.Generator().manual_seed(0)
    assert selector.plan_epoch(torch.full((10,), float("nan")), generator, 0) is None
    losses = torch.tensor([0.5, 3.0, float("nan"), 0.1, 2.0, 0.2, 0.3, 0.4, 0.6, 0.7])
    assert selector.plan_epoch(losses, generator, 1).indices.tolist() == [1, 2, 4]  # untrained ranks first
    # Later epochs train the same subset, whatever the kept examples' losses became.
    assert selector.plan_epoch(torch.arange(10.0), generator, 2).indices.tolist() == [1, 2, 4]


def test_the_random_control_keeps_a_fixed_subset_of_the_same_size():
    selector = EarlyPruneSelector(keep=0.25, by="random", num_epochs=3)
    generator = torch.Generator().manual_seed(0)
    first = selector.plan_epoch(torch.arange(1000.0), generator, 1).indices
    assert first.numel() == 250 and first.unique().numel() == 250
    assert not torch.equal(first, torch.arange(750, 1000))  # not the highest losses
    assert torch.equal(selector.plan_epoch(torch.zeros(1000), generator, 2).indices, first)


def test_state_holds_the_subset_and_the_schedule_counts_the_full_epochs():
    selector = EarlyPruneSelector(keep=0.5, by="loss", num_epochs=6)
    selector.plan_epoch(torch.arange(8.0), torch.Generator(), 1)
    restored = EarlyPruneSelector(keep=0.5, by="loss", num_epochs=6)
    restored.load_state_dict(selector.state_dict())
    assert restored.plan_epoch(torch.zeros(8), torch.Generator(), 2).indices.tolist() == [4, 5, 6, 7]
    assert selector.expected_keep_fraction() == pytest.approx((1 + 5 * 0.5) / 6)
    assert EarlyPruneSelector(0.5, "loss", 6, full_epochs=0).expected_keep_fraction() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="by must be one of loss, coverage, random"):
        EarlyPruneSelector(0.5, "confidence", 6)


def test_annealing_trains_everything_from_its_share_of_the_epochs_and_sizes_the_schedule():
    selector = EarlyPruneSelector(keep=0.5, by="loss", num_epochs=4, anneal_delta=0.75)
    generator = torch.Generator()
    assert selector.plan_epoch(torch.arange(8.0), generator, 1).indices.tolist() == [4, 5, 6, 7]
    assert selector.plan_epoch(torch.zeros(8), generator, 2).indices.tolist() == [4, 5, 6, 7]
    assert selector.plan_epoch(torch.zeros(8), generator, 3) is None  # epoch 3 >= 0.75 x 4: everything
    assert selector.state_dict()["kept"].tolist() == [4, 5, 6, 7]  # the subset survives the annealing
    assert selector.expected_keep_fraction() == pytest.approx((1 + 2 * 0.5 + 1) / 4)
    # An annealing point inside an epoch anneals from the next whole epoch: 0.9 x 12 = 10.8, so epoch 11 alone.
    assert EarlyPruneSelector(0.6, "loss", 12, anneal_delta=0.9).expected_keep_fraction() == pytest.approx(8 / 12)
    assert EarlyPruneSelector(0.6, "loss", 12).expected_keep_fraction() == pytest.approx((1 + 11 * 0.6) / 12)
    with pytest.raises(ValueError, match=r"anneal_delta must be in \[0, 1\], got 1.5"):
        EarlyPruneSelector(0.5, "loss", 4, anneal_delta=1.5)


class StoreAtEpochStart(TrainerCallback):
    """The loss store as each epoch starts: before epoch 1, every example's first-epoch loss."""

    def __init__(self, trainer):
        self.trainer, self.stores = trainer, []

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.stores.append(self.trainer.engine.store.lookup(torch.arange(N))[0].clone())


class Recorded(TrainedIds):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.starts = StoreAtEpochStart(self)
        self.add_callback(self.starts)


@pytest.mark.parametrize("warmup", [0, 1])
def test_later_epochs_load_and_train_only_the_first_epochs_hardest(output_dir, warmup):
    rows = CountingRows()
    trainer = train(output_dir, rows, trainer_cls=Recorded, sb_strategy="early_prune", sb_keep=0.25,
                    sb_warmup_epochs=warmup, num_train_epochs=3)
    kept = keep_count(0.25, N)
    first_losses = trainer.starts.stores[1]
    assert bool(torch.isfinite(first_losses).all())
    hardest = set(torch.argsort(first_losses, descending=True)[:kept].tolist())
    assert set((rows.loads == 3).nonzero().squeeze(1).tolist()) == hardest
    assert int((rows.loads == 1).sum()) == N - kept  # the rest: the first epoch only
    trained = torch.cat(trainer.trained)
    assert torch.equal(torch.bincount(trained, minlength=N), rows.loads)
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 0 and stats["backwards"] == N + 2 * kept


@pytest.mark.parametrize("strategy", ["early_prune", "early_random"])
def test_an_annealed_run_trains_the_subset_then_everything_in_its_last_epoch(output_dir, strategy):
    rows = CountingRows()
    trainer = train(output_dir, rows, sb_strategy=strategy, sb_keep=0.25, sb_anneal_delta=0.6, num_train_epochs=3)
    kept = keep_count(0.25, N)
    # Epoch 0 trains everything, epoch 1 the subset, epoch 2 (>= 0.6 x 3) everything again.
    assert int((rows.loads == 3).sum()) == kept and int((rows.loads == 2).sum()) == N - kept
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 0 and stats["backwards"] == 2 * N + kept


def test_the_random_control_trains_a_random_subset_of_the_same_size(output_dir):
    rows = CountingRows()
    train(output_dir, rows, sb_strategy="early_random", sb_keep=0.25, num_train_epochs=3)
    again = int((rows.loads == 3).sum())
    assert again == keep_count(0.25, N) and int((rows.loads == 1).sum()) == N - again


def test_early_prune_resumes_inside_a_pruned_epoch_bit_for_bit(output_dir, tmp_path):
    full, resumed = resume_inside_a_planned_epoch(output_dir, tmp_path, sb_strategy="early_prune", sb_keep=0.5,
                                                  num_train_epochs=3)
    assert resumed.sb_stats["kept"] == full.sb_stats["kept"]


def test_a_stream_is_refused_before_training(output_dir):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            data = make_dataset(8)
            for i in range(8):
                yield {"pixel_values": data["pixel_values"][i], "labels": data["labels"][i], "index": i}

    args = make_config(output_dir, sb_strategy="early_prune", sb_keep=0.5, max_steps=4)
    with pytest.raises(ValueError, match=r"--sb_strategy early_prune .* a stream has no positions"):
        SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=Rows(), args=args)
