"""InfoBatch: easy examples pruned before loading at rate r, the kept easy ones reweighted, all data at the end."""

import pytest
import torch
from test_engine import CountingRows, N, TrainedIds, resume_inside_a_planned_epoch, train
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.selectors import InfoBatchSelector
from hf_selective_backprop.trainer import WEIGHT_KEY


def test_plan_drops_below_mean_examples_at_rate_r_and_reweights_the_kept_ones():
    generator = torch.Generator().manual_seed(0)
    losses = torch.cat([torch.full((10_000,), 0.1), torch.full((10_000,), 2.0), torch.full((50,), float("nan"))])
    plan = InfoBatchSelector(prune_ratio=0.3, anneal_delta=0.875, num_epochs=8).plan_epoch(losses, generator, 0)
    kept = torch.zeros(losses.numel(), dtype=torch.bool)
    kept[plan.indices] = True
    assert plan.indices.unique().numel() == plan.indices.numel()
    assert abs(1 - kept[:10_000].float().mean().item() - 0.3) < 0.015  # easy ones dropped at rate r
    assert bool(kept[10_000:].all())  # hard and never-trained examples always kept
    weight = dict(zip(plan.indices.tolist(), plan.weights.tolist(), strict=True))
    assert {round(weight[i], 5) for i in range(10_000) if kept[i]} == {round(1 / 0.7, 5)}
    assert {weight[i] for i in range(10_000, losses.numel())} == {1.0}


def test_plan_keeps_everything_before_any_loss_is_known_and_in_the_annealed_tail():
    selector = InfoBatchSelector(prune_ratio=0.5, anneal_delta=0.5, num_epochs=4)
    generator = torch.Generator().manual_seed(0)
    assert selector.plan_epoch(torch.full((10,), float("nan")), generator, 0) is None
    assert selector.plan_epoch(torch.arange(10.0), generator, 1) is not None
    assert selector.plan_epoch(torch.arange(10.0), generator, 2) is None


class WeightsSeen(TrainedIds):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.weights_seen = getattr(self, "weights_seen", [])
        self.weights_seen.append(inputs[WEIGHT_KEY].clone())
        return super().training_step(model, inputs, num_items_in_batch)


def test_infobatch_trains_without_selection_forwards_and_anneals_to_all_data(output_dir):
    rows = CountingRows()
    trainer = train(output_dir, rows, trainer_cls=WeightsSeen, sb_strategy="infobatch", sb_prune_ratio=0.5,
                    sb_anneal_delta=0.5, num_train_epochs=4)
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 0
    # Epoch 0 (no losses yet) and the annealed epochs 2 and 3 load everything; epoch 1 prunes.
    pruned_epoch = int(rows.loads.sum()) - 3 * N
    assert N / 2 < pruned_epoch < N
    assert stats["examples_loaded"] == int(rows.loads.sum()) and stats["examples_seen"] == 4 * N
    weights = torch.cat(trainer.weights_seen)
    assert set(weights.unique().tolist()) == {1.0, 2.0}  # 1/(1-r) on the kept easy examples of epoch 1
    assert int((weights == 2.0).sum()) < N / 2


def test_infobatch_resumes_inside_a_pruned_epoch_to_the_same_weights(output_dir, tmp_path):
    full, resumed = resume_inside_a_planned_epoch(output_dir, tmp_path, sb_strategy="infobatch", sb_anneal_delta=0.75,
                                                  num_train_epochs=4)
    assert resumed.sb_stats["kept"] == full.sb_stats["kept"]


def test_the_default_trains_max_steps_on_map_style_data_and_anneals_in_the_epochs_the_trainer_derives(output_dir):
    # 32 rows in steps of 4: 8 steps an epoch, so max_steps=20 covers 3 epochs as the Trainer counts them; annealed
    # from 2/3 of them, the third epoch (and any after it) trains everything.
    args = make_config(output_dir, sb_strategy="infobatch", max_steps=20, per_device_train_batch_size=4,
                       sb_anneal_delta=2 / 3)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(32), args=args)
    trainer.train()
    assert trainer.state.global_step == 20
    assert trainer.selector.num_epochs == 3
    assert trainer.sb_stats["backwards"] == 20 * 4  # every step a full batch


def test_infobatch_refuses_a_prune_ratio_of_one(output_dir):
    with pytest.raises(ValueError, match=r"--sb_prune_ratio must be in \[0, 1\), got 1.0"):
        SelectiveBackpropConfig(output_dir=output_dir, sb_strategy="infobatch", sb_prune_ratio=1.0)
