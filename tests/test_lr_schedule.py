"""Step decay at shares of a run (--lr_decay_milestones): where the decays fall, with and without selection,
and a resume across a decay point."""

import math
import os
from types import SimpleNamespace

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset
from transformers import TrainerCallback

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.lr_schedule import at_progress, step_decay

PAPER = dict(lr_scheduler_type="constant", lr_decay_milestones=[0.3, 0.6, 0.8], lr_decay_factor=0.2)


def test_decays_at_each_share_of_the_run_on_top_of_the_base_schedule():
    decayed = step_decay(lambda step: 1.0, [0.3, 0.6, 0.8], 0.2, 10)
    # 0.3 of 10 steps is step 3 exactly, not step 4 (0.3 * 10 = 3.0000000000000004).
    assert [decayed(s) for s in range(10)] == pytest.approx([1, 1, 1, 0.2, 0.2, 0.2, 0.04, 0.04, 0.008, 0.008])
    warm = step_decay(lambda step: min(1.0, (step + 1) / 2), [0.5], 0.1, 4)
    assert [warm(s) for s in range(4)] == pytest.approx([0.5, 1.0, 0.1, 0.1])


@pytest.mark.parametrize(
    "milestones, factor, match",
    [
        ([0.6, 0.3], 0.2, "increasing"),
        ([0.0, 0.5], 0.2, "increasing"),
        ([0.5, 1.0], 0.2, "increasing"),
        ([math.nan], 0.2, "increasing"),
        ([], 0.2, "increasing"),
        ([0.5], 0.0, "lr_decay_factor"),
        ([0.5], 1.5, "lr_decay_factor"),
    ],
)
def test_bad_milestones_are_refused_by_flag_before_training(milestones, factor, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        make_config(str(tmp_path), lr_decay_milestones=milestones, lr_decay_factor=factor)


def test_plateau_schedule_cannot_take_milestones(tmp_path):
    with pytest.raises(ValueError, match="--lr_scheduler_type"):
        make_config(
            str(tmp_path), lr_decay_milestones=[0.5], lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch"
        )


class _LearningRates(TrainerCallback):
    """(epoch at the step's start, learning rate the step used) for every optimizer step."""

    def __init__(self):
        self.seen = []
        self._epoch = 0.0

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        self._epoch = state.epoch or 0.0

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        self.seen.append((self._epoch, optimizer.param_groups[0]["lr"]))


def _train(output_dir, **settings):
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), args=make_config(output_dir, **settings), train_dataset=make_dataset(120)
    )
    rates = _LearningRates()
    trainer.add_callback(rates)
    return trainer, rates


def _expected(epoch: float, epochs: int) -> float:
    return 0.05 * 0.2 ** sum(epoch / epochs >= m - 1e-9 for m in PAPER["lr_decay_milestones"])


def test_traditional_run_decays_at_the_paper_epochs(tmp_path):
    trainer, rates = _train(str(tmp_path), sb_strategy="none", num_train_epochs=10, **PAPER)
    trainer.train()
    # 15 steps an epoch: steps 45, 90 and 120 of 150 are the first of epochs 3, 6 and 8 (0-based).
    lrs = [lr for _, lr in rates.seen]
    assert lrs[44] == pytest.approx(0.05) and lrs[45] == pytest.approx(0.01)
    assert lrs[89] == pytest.approx(0.01) and lrs[90] == pytest.approx(0.002)
    assert lrs[119] == pytest.approx(0.002) and lrs[120] == pytest.approx(0.0004)


def test_under_selection_the_decays_follow_epochs_of_data_read_not_steps(tmp_path):
    # SB keeps about a third: a third as many steps as Traditional, the decays still at epochs 3, 6 and 8.
    trainer, rates = _train(
        str(tmp_path), sb_strategy="sb", sb_keep=1 / 3, num_train_epochs=10, sb_selection_batch_size=24, **PAPER
    )
    trainer.train()
    assert len(rates.seen) < 100
    # A step's rate is set from the data read before it, so within a selection batch (0.2 epochs) of a
    # decay either rate is right; everywhere else only the one of its epoch.
    for epoch, lr in rates.seen:
        if all(abs(epoch - 10 * m) > 0.3 for m in PAPER["lr_decay_milestones"]):
            assert lr == pytest.approx(_expected(epoch, 10)), epoch
    assert sorted({round(lr, 6) for _, lr in rates.seen}) == [0.0004, 0.002, 0.01, 0.05]


def test_resume_across_a_decay_point_continues_the_schedule(tmp_path):
    settings = dict(sb_strategy="sb", sb_keep=0.5, num_train_epochs=4, sb_selection_batch_size=24,
                    lr_scheduler_type="constant", lr_decay_milestones=[0.5], lr_decay_factor=0.1,
                    save_strategy="epoch")
    reference, reference_rates = _train(str(tmp_path / "ref"), **settings)
    reference.train()
    # The checkpoint at the end of epoch 2 is just before the decay at half the run.
    checkpoint = sorted(
        (name for name in os.listdir(tmp_path / "ref") if name.startswith("checkpoint-")),
        key=lambda name: int(name.split("-")[1]),
    )[1]
    resumed, resumed_rates = _train(str(tmp_path / "resumed"), **{**settings, "save_strategy": "no"})
    resumed.train(resume_from_checkpoint=str(tmp_path / "ref" / checkpoint))
    steps_before = int(checkpoint.split("-")[1])
    assert [lr for _, lr in resumed_rates.seen] == [lr for _, lr in reference_rates.seen[steps_before:]]
    assert resumed_rates.seen[0][1] == pytest.approx(0.005)  # already decayed, as the uninterrupted run was
    for (name, ours), theirs in zip(resumed.model.state_dict().items(), reference.model.state_dict().values(),
                                    strict=True):
        assert torch.equal(ours, theirs), name


def test_a_run_that_outlives_its_sized_steps_reaches_the_schedules_end_only_at_its_last_step():
    """Sized to 10 steps, a run still short of its end (progress 0.97, as its 30th of 31 steps would be) takes
    the schedule's next-to-last value, not its end (a linear decay's zero); done, the end."""
    linear = lambda step: (10 - step) / 10  # noqa: E731
    trainer = SimpleNamespace(is_in_train=True, engine=SimpleNamespace(follows_progress=True))
    for progress, expected in ((0.5, 0.5), (0.97, 0.1), (1.0, 0.0)):
        trainer.training_progress = lambda p=progress: p
        assert at_progress(linear, trainer, 10, step=30) == pytest.approx(expected)
