"""Resuming an augmented run: the augmentation generators are in the checkpoint, as of the last batch read.

A reference run (random crops, flips and cutout on 8x8 images; a model with dropout) saves after
every step; runs resumed from checkpoints all over it (mid-epoch with a batch already loaded ahead,
at epoch ends, inside Stale-SB epochs) must end with its weights, counters and augmentation
generator. The augmentation runs in the dataset (`ImageTensorDataset`, as in `scripts/train.py`) or
in a data collator, and in one scenario the collator also augments evaluation batches between steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings

import pytest
import torch
from test_resume import checkpoints
from tiny import TinyConv, augmentation, make_config, make_image_dataset, make_images

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.accounting import COUNTERS
from hf_selective_backprop.engine.checkpoints import RANK_STATE_FILE, STATE_FILE
from hf_selective_backprop.engine.data_state import DataState
from hf_selective_backprop.trainer import STATS_FILE

N = 64


class RawImages(torch.utils.data.Dataset):
    """uint8 rows; the collator stacks and augments them."""

    def __init__(self, n: int = N, seed: int = 0):
        self.pixels, self.labels = make_images(n, seed)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, position):
        return {"pixel_values": self.pixels[position], "labels": self.labels[position]}


class AugmentingCollator:
    """A data collator with its own random state: `BatchTransform` on the stacked batch."""

    def __init__(self, seed: int):
        self.transform = augmentation(seed)

    def __call__(self, rows):
        batch = {key: torch.stack([torch.as_tensor(row[key]) for row in rows]) for key in rows[0]}
        batch["pixel_values"] = self.transform(batch["pixel_values"])
        return batch

    def state_dict(self):
        return self.transform.state_dict()

    def load_state_dict(self, state):
        self.transform.load_state_dict(state)


TRAINING = dict(sb_beta=1.0, per_device_train_batch_size=4, sb_selection_batch_size=6, num_train_epochs=3)
SCENARIOS = {
    # SB, augmentation in the dataset (the image workflow's layout).
    "sb_dataset": dict(source="dataset", seed=0, settings=dict(TRAINING)),
    # Stale-SB n=2, augmentation in the collator, which also augments an evaluation every 3 steps:
    # those draws fall between a batch loaded ahead and the checkpoint.
    "stale_collator": dict(
        source="collator", seed=1, settings=dict(TRAINING, sb_staleness=2, eval_strategy="steps", eval_steps=3)
    ),
    # Stale-SB n=3 with accumulation: stale epochs load only their planned rows.
    "stale_dataset": dict(
        source="dataset", seed=2, settings=dict(TRAINING, sb_staleness=3, gradient_accumulation_steps=2)
    ),
}


def new_trainer(output_dir: str, scenario: str, **overrides) -> SelectiveBackpropTrainer:
    spec = SCENARIOS[scenario]
    seed, settings = spec["seed"], {**spec["settings"], **overrides}
    collator, evaluation = None, None
    if spec["source"] == "dataset":
        train = make_image_dataset(N, seed)
    else:
        train, collator = RawImages(seed=seed), AugmentingCollator(seed)
        evaluation = RawImages(16, seed=seed + 100) if settings.get("eval_strategy") else None
    return SelectiveBackpropTrainer(
        model=TinyConv(), args=make_config(output_dir, seed=seed, **settings), train_dataset=train,
        eval_dataset=evaluation, data_collator=collator,
    )  # fmt: skip


def augmentation_state(trainer: SelectiveBackpropTrainer) -> torch.Tensor:
    (source,) = trainer.engine.data_state.sources.values()  # the dataset or the collator
    return source.transform.generator.get_state()


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def get(scenario: str):
        if scenario not in cache:
            output_dir = str(tmp_path_factory.mktemp(f"augmented-{scenario}"))
            trainer = new_trainer(output_dir, scenario, save_strategy="steps", save_steps=1)
            trainer.train()
            cache[scenario] = (trainer, output_dir)
        return cache[scenario]

    return get


def step(checkpoint: str) -> int:
    return int(checkpoint.rsplit("-", 1)[1])


def data_state(checkpoint: str) -> dict:
    return torch.load(os.path.join(checkpoint, RANK_STATE_FILE.format(rank=0)), weights_only=True)["data"]


def spread(output_dir: str) -> list[str]:
    """The first step, every third (mostly mid-epoch, with a batch loaded ahead; in `stale_collator` just
    after an evaluation) and every epoch's last (nothing loaded ahead)."""
    return [c for c in checkpoints(output_dir) if step(c) == 1 or step(c) % 3 == 0 or data_state(c)["refetch"] == 0]


def resume(checkpoint: str, output_dir: str, scenario: str) -> SelectiveBackpropTrainer:
    trainer = new_trainer(output_dir, scenario)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=checkpoint)
    ours = [str(w.message) for w in caught if "hf_selective_backprop" in w.filename]
    # Same settings and data but for saving: that is the only difference named.
    only_saving = "differ from the saved run's: save_strategy: saved 'steps', now 'no'; save_steps: saved 1, now 500."
    assert len(ours) == 1 and only_saving in ours[0], ours
    return trainer


def assert_same_end(resumed: SelectiveBackpropTrainer, reference: SelectiveBackpropTrainer, where: str) -> None:
    assert resumed.state.global_step == reference.state.global_step, where
    theirs = reference.model.state_dict()
    for name, ours in resumed.model.state_dict().items():
        assert torch.equal(ours, theirs[name]), (where, name)
    assert torch.equal(augmentation_state(resumed), augmentation_state(reference)), where
    assert {k: resumed.sb_stats[k] for k in COUNTERS} == {k: reference.sb_stats[k] for k in COUNTERS}, where


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_augmented_run_resumed_from_checkpoints_all_over_it_reaches_the_same_weights(scenario, references, tmp_path):
    reference, output_dir = references(scenario)
    chosen = spread(output_dir)
    epochs = {torch.load(os.path.join(c, STATE_FILE), weights_only=True)["epoch"] for c in chosen}
    assert epochs == {0, 1, 2} and {data_state(c)["refetch"] for c in chosen} == {0, 1}
    for checkpoint in chosen:
        resumed = resume(checkpoint, str(tmp_path / os.path.basename(checkpoint)), scenario)
        assert_same_end(resumed, reference, checkpoint)
    last = tmp_path / os.path.basename(chosen[-1])
    with open(os.path.join(output_dir, STATS_FILE)) as a, open(last / STATS_FILE) as b:
        saved, ours = json.load(a), json.load(b)
    assert {k: saved[k] for k in COUNTERS} == {k: ours[k] for k in COUNTERS}


def _saved_as_it_is_at_saving(self):
    # What a naive save holds: the state after the batch loaded ahead, and nothing to load again.
    now = self._snapshot()
    return {"sources": now, "refetch": 0, "then": now}


def _loader_seed_drawn_again(devices):
    return contextlib.nullcontext()  # instead of torch.random.fork_rng: the resumed epoch's loader draws again


def _draws_after_the_batch_loaded_ahead_dropped(load):
    def load_state_dict(self, state):
        load(self, state)
        self._refetch = 0  # the batch loaded again, but the state at saving time never applied

    return load_state_dict


@pytest.mark.parametrize(
    "broken, scenario",
    [
        ("not_restored", "sb_dataset"),
        ("saved_as_it_is", "sb_dataset"),
        ("evaluation_draws_dropped", "stale_collator"),
        ("loader_seed_drawn_again", "sb_dataset"),
    ],
)
def test_the_runs_differ_without_the_data_state_or_its_handling_of_batches_loaded_ahead(
    broken, scenario, monkeypatch, tmp_path
):
    """The checks above can fail: without the augmentation state, with the state after the batch loaded
    ahead, without the collator's draws for an evaluation after it, or with the DataLoader's base seed
    drawn from the global RNG again (shifting dropout), the resumed run ends elsewhere."""
    if broken == "not_restored":
        monkeypatch.setattr(DataState, "load_state_dict", lambda self, state: None)
    elif broken == "saved_as_it_is":
        monkeypatch.setattr(DataState, "state_dict", _saved_as_it_is_at_saving)
    elif broken == "loader_seed_drawn_again":
        monkeypatch.setattr(torch.random, "fork_rng", _loader_seed_drawn_again)
    else:
        monkeypatch.setattr(DataState, "load_state_dict", _draws_after_the_batch_loaded_ahead_dropped(
            DataState.load_state_dict))  # fmt: skip
    reference = new_trainer(str(tmp_path / "reference"), scenario, save_strategy="steps", save_steps=3)
    reference.train()
    checkpoint = str(tmp_path / "reference" / "checkpoint-6")  # mid-epoch; in stale_collator just after an eval
    assert torch.load(os.path.join(checkpoint, STATE_FILE), weights_only=True)["consumed"] > 0
    resumed = new_trainer(str(tmp_path / "resumed"), scenario)
    resumed.train(resume_from_checkpoint=checkpoint)
    theirs = reference.model.state_dict()
    same_weights = all(torch.equal(ours, theirs[name]) for name, ours in resumed.model.state_dict().items())
    assert resumed.state.global_step != reference.state.global_step or not same_weights


def test_a_checkpoint_without_data_state_or_run_signature_warns_and_continues(references, tmp_path):
    reference, output_dir = references("sb_dataset")
    checkpoint = tmp_path / "old"
    shutil.copytree(spread(output_dir)[1], checkpoint)
    for name, key in ((STATE_FILE, "run"), (RANK_STATE_FILE.format(rank=0), "data")):
        state = torch.load(checkpoint / name, weights_only=True)
        del state[key]  # as an earlier version wrote it
        torch.save(state, checkpoint / name)
    trainer = new_trainer(str(tmp_path / "out"), "sb_dataset")
    with pytest.warns(UserWarning) as caught:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    messages = [str(w.message) for w in caught]
    assert any("does not record the settings and data of the run that saved it" in m for m in messages)
    assert any("holds no random state of the training dataset (augmentation)" in m for m in messages)
    # It continues to the end of the run; without the augmentation state its steps may differ.
    assert trainer.state.epoch == reference.state.epoch


def test_with_dataloader_workers_a_resume_says_the_augmentation_state_is_not_restored(references, tmp_path):
    _, output_dir = references("sb_dataset")
    trainer = new_trainer(str(tmp_path / "out"), "sb_dataset", dataloader_num_workers=1)
    with pytest.warns(UserWarning, match=r"random state of the training dataset \(augmentation\) is not restored: "
                      r"dataloader_num_workers=1 runs the dataset and collator in worker processes"):
        trainer.train(resume_from_checkpoint=spread(output_dir)[1])


# ---- without selection -------------------------------------------------------------------------------


PLAIN = {
    # The image workflow's layout, with accumulation: a step reads two batches.
    "dataset": dict(source="dataset", seed=3, settings=dict(TRAINING, gradient_accumulation_steps=2)),
    # A collator that also augments an evaluation every 3 steps, between a batch loaded ahead and the checkpoint.
    "collator": dict(source="collator", seed=4, settings=dict(TRAINING, eval_strategy="steps", eval_steps=3)),
}


def plain_trainer(output_dir: str, layout: str, **overrides) -> SelectiveBackpropTrainer:
    spec = PLAIN[layout]
    seed, settings = spec["seed"], {**spec["settings"], **overrides, "sb_strategy": "none"}
    del settings["sb_beta"], settings["sb_selection_batch_size"]
    if spec["source"] == "dataset":
        train, collator, evaluation = make_image_dataset(N, seed), None, None
    else:
        train, collator, evaluation = RawImages(seed=seed), AugmentingCollator(seed), RawImages(16, seed=seed + 100)
    return SelectiveBackpropTrainer(
        model=TinyConv(), args=make_config(output_dir, seed=seed, **settings), train_dataset=train,
        eval_dataset=evaluation, data_collator=collator,
    )  # fmt: skip


def plain_augmentation_state(trainer: SelectiveBackpropTrainer) -> torch.Tensor:
    source = trainer.data_collator if isinstance(trainer.data_collator, AugmentingCollator) else trainer.train_dataset
    return source.transform.generator.get_state()


@pytest.mark.parametrize("layout", list(PLAIN))
def test_a_run_without_selection_resumes_its_augmentation_exactly(layout, tmp_path):
    # Only the selective path saved the augmentation state of the batch the loader reads ahead: a resumed
    # `--sb_strategy none` run (Traditional, the baseline of every comparison) drew other crops and ended elsewhere.
    reference = plain_trainer(str(tmp_path / "reference"), layout, save_strategy="steps", save_steps=1)
    reference.train()
    steps_per_epoch = reference.state.max_steps // TRAINING["num_train_epochs"]
    chosen = [c for c in checkpoints(str(tmp_path / "reference"))
              if step(c) == 1 or step(c) % 5 == 0 or step(c) % steps_per_epoch == 0][:-1]
    assert any(step(c) % steps_per_epoch for c in chosen) and any(not step(c) % steps_per_epoch for c in chosen)
    for checkpoint in chosen:
        resumed = plain_trainer(str(tmp_path / os.path.basename(checkpoint)), layout)
        resumed.train(resume_from_checkpoint=checkpoint)
        assert resumed.state.global_step == reference.state.global_step, checkpoint
        theirs = reference.model.state_dict()
        for name, ours in resumed.model.state_dict().items():
            assert torch.equal(ours, theirs[name]), (checkpoint, name)
        assert torch.equal(plain_augmentation_state(resumed), plain_augmentation_state(reference)), checkpoint
