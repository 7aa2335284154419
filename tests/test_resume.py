"""Resume anywhere (issue 6): a resumed run continues the saved one bit for bit.

In-process: one reference run saves a checkpoint after every optimizer step; new trainers resume
from chosen checkpoints (mid-epoch, with a partial step queued, inside a Stale-SB epoch, at an
epoch boundary) and must end with the reference's weights, step count, loss history, loss store,
queue, generator and counters. Out of process: an augmented run killed with SIGKILL is resumed from
its last complete checkpoint and must end where an uninterrupted run ends.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from launch import watch
from tiny import TinyClassifier, make_config, make_dataset
from transformers.trainer_utils import get_last_checkpoint

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.accounting import COUNTERS
from hf_selective_backprop.engine.checkpoints import (
    RANK_STATE_FILE,
    STATE_FILE,
    is_complete_checkpoint,
    last_complete_checkpoint,
)
from hf_selective_backprop.trainer import STATS_FILE

TESTS = os.path.dirname(os.path.abspath(__file__))
N = 96

SCENARIOS = {
    # Plain SB, one micro-batch per step: a checkpoint part-way through epoch 1.
    "mid_epoch": dict(sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=8, num_train_epochs=3),
    # Selection batches of 6 feed micro-batches of 4 with 2 accumulation steps: the queue carries a partial step.
    "mid_accumulation": dict(
        sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        sb_selection_batch_size=6, num_train_epochs=3,
    ),
    # Stale-SB n=3: epochs 1 and 2 select from stored losses, with no selection forward.
    "stale_epoch": dict(
        sb_strategy="sb", sb_beta=1.0, sb_staleness=3, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        sb_selection_batch_size=6, num_train_epochs=3,
    ),
    # Checkpoints at epoch ends: the saved position is "epoch e, nothing read yet".
    "epoch_boundary": dict(
        sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=4, sb_selection_batch_size=6,
        sb_staleness=2, num_train_epochs=3, save_strategy="epoch",
    ),
}


def _saved(checkpoint: str) -> tuple[dict, dict]:
    shared = torch.load(os.path.join(checkpoint, STATE_FILE), weights_only=False)
    rank = torch.load(os.path.join(checkpoint, RANK_STATE_FILE.format(rank=0)), weights_only=False)
    return shared, rank


def _queued(rank: dict) -> int:
    rows = rank["queue"]["rows"]
    return len(next(iter(rows.values()))) if rows else 0


def _mid_epoch(shared, rank, settings):
    return shared["epoch"] == 1 and shared["consumed"] > 0


def _mid_accumulation(shared, rank, settings):
    # A partial micro-batch queued: fewer rows than a step needs, and not a whole number of micro-batches.
    queued = _queued(rank)
    return shared["consumed"] > 0 and queued % settings["per_device_train_batch_size"] != 0


def _stale_epoch(shared, rank, settings):
    return shared["epoch"] in (1, 2) and shared["consumed"] > 0 and _queued(rank) > 0


def _epoch_boundary(shared, rank, settings):
    return shared["epoch"] == 1 and shared["consumed"] == 0


PICK = {
    "mid_epoch": _mid_epoch,
    "mid_accumulation": _mid_accumulation,
    "stale_epoch": _stale_epoch,
    "epoch_boundary": _epoch_boundary,
}


def checkpoints(output_dir: str) -> list[str]:
    names = [name for name in os.listdir(output_dir) if name.startswith("checkpoint-")]
    return [os.path.join(output_dir, name) for name in sorted(names, key=lambda name: int(name.split("-")[1]))]


def new_trainer(output_dir: str, settings: dict) -> SelectiveBackpropTrainer:
    return SelectiveBackpropTrainer(
        model=TinyClassifier(), args=make_config(output_dir, **settings), train_dataset=make_dataset(N)
    )


def assert_same_run(resumed: SelectiveBackpropTrainer, reference: SelectiveBackpropTrainer) -> None:
    assert resumed.state.global_step == reference.state.global_step
    for (name, ours), (_, theirs) in zip(
        resumed.model.state_dict().items(), reference.model.state_dict().items(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    assert resumed.lr_scheduler.get_last_lr() == reference.lr_scheduler.get_last_lr()
    assert torch.equal(
        resumed.selector.state_dict()["history"]["values"], reference.selector.state_dict()["history"]["values"]
    )
    torch.testing.assert_close(
        resumed.engine.store.losses, reference.engine.store.losses, rtol=0, atol=0, equal_nan=True
    )
    assert torch.equal(resumed.engine.store.epochs, reference.engine.store.epochs)
    ours, theirs = resumed.engine.queue.state_dict()["rows"], reference.engine.queue.state_dict()["rows"]
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(resumed.engine.generator.get_state(), reference.engine.generator.get_state())
    for key in COUNTERS:
        assert resumed.sb_stats[key] == reference.sb_stats[key], key


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One reference run per scenario, checkpointed after every step (or every epoch)."""
    cache = {}

    def get(scenario: str):
        if scenario not in cache:
            output_dir = str(tmp_path_factory.mktemp(f"reference-{scenario}"))
            settings = {"save_strategy": "steps", "save_steps": 1, **SCENARIOS[scenario]}
            trainer = new_trainer(output_dir, settings)
            trainer.train()
            cache[scenario] = (trainer, output_dir, settings)
        return cache[scenario]

    return get


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_resume_from_any_checkpoint_reaches_the_same_run(scenario, references, tmp_path):
    reference, output_dir, settings = references(scenario)
    chosen = [c for c in checkpoints(output_dir) if PICK[scenario](*_saved(c), settings)]
    assert chosen, f"no checkpoint of the reference run is a {scenario} checkpoint"
    checkpoint = chosen[0]
    resumed = new_trainer(str(tmp_path / "resumed"), {**settings, "save_strategy": "no"})
    resumed.train(resume_from_checkpoint=checkpoint)
    assert_same_run(resumed, reference)
    with open(os.path.join(output_dir, STATS_FILE)) as a, open(tmp_path / "resumed" / STATS_FILE) as b:
        saved, ours = json.load(a), json.load(b)
    assert {k: saved[k] for k in COUNTERS} == {k: ours[k] for k in COUNTERS}


def test_selection_state_is_written_before_trainer_state(monkeypatch, tmp_path):
    """trainer_state.json is the last file of a checkpoint, so it marks a complete one."""
    from transformers.trainer_callback import TrainerState

    seen = []
    save_to_json = TrainerState.save_to_json

    def spy(self, json_path):
        folder = os.path.dirname(json_path)
        seen.append(all(os.path.isfile(os.path.join(folder, f)) for f in (STATE_FILE, RANK_STATE_FILE.format(rank=0))))
        return save_to_json(self, json_path)

    monkeypatch.setattr(TrainerState, "save_to_json", spy)
    trainer = new_trainer(str(tmp_path), dict(sb_strategy="sb", max_steps=3, save_strategy="steps", save_steps=1,
                                              per_device_train_batch_size=8, save_total_limit=1))
    trainer.train()
    assert seen == [True, True, True]
    # Rotation (after trainer_state.json) removed the older ones; the survivor is complete, no temporaries.
    assert checkpoints(str(tmp_path)) == [str(tmp_path / "checkpoint-3")]
    assert is_complete_checkpoint(str(tmp_path / "checkpoint-3"))
    assert not [name for name in os.listdir(tmp_path / "checkpoint-3") if name.endswith(".partial")]


def test_resume_true_skips_a_partially_written_checkpoint(references, tmp_path):
    reference, output_dir, settings = references("mid_accumulation")
    all_checkpoints = checkpoints(output_dir)
    middle = len(all_checkpoints) // 2
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    for checkpoint in all_checkpoints[: middle + 1]:
        shutil.copytree(checkpoint, run_dir / os.path.basename(checkpoint))
    # What a kill during the next save leaves: every file but trainer_state.json (written last) ...
    partial = run_dir / os.path.basename(all_checkpoints[middle + 1])
    shutil.copytree(all_checkpoints[middle + 1], partial)
    os.remove(partial / "trainer_state.json")
    # ... and, one further, a folder with a truncated trainer_state.json.
    truncated = run_dir / f"checkpoint-{int(os.path.basename(all_checkpoints[middle + 1]).split('-')[1]) + 1}"
    shutil.copytree(all_checkpoints[middle + 1], truncated)
    (truncated / "trainer_state.json").write_text('{"global_step": ')

    assert get_last_checkpoint(str(run_dir)) == str(truncated)  # transformers would pick the broken one
    assert not is_complete_checkpoint(str(partial)) and not is_complete_checkpoint(str(truncated))
    assert last_complete_checkpoint(str(run_dir)) == str(run_dir / os.path.basename(all_checkpoints[middle]))

    resumed = new_trainer(str(run_dir), {**settings, "save_strategy": "no"})
    resumed.train(resume_from_checkpoint=True)
    assert_same_run(resumed, reference)


def test_resume_true_without_a_complete_checkpoint_is_a_clear_error(references, tmp_path):
    _, output_dir, settings = references("mid_accumulation")
    partial = tmp_path / "checkpoint-3"
    shutil.copytree(checkpoints(output_dir)[2], partial)
    os.remove(partial / "trainer_state.json")
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory .*sb_state.pt"):
        new_trainer(str(tmp_path), settings).train(resume_from_checkpoint=True)


@pytest.mark.parametrize("missing", [STATE_FILE, RANK_STATE_FILE.format(rank=0), RANK_STATE_FILE.format(rank=1)])
def test_a_checkpoint_missing_a_selection_state_file_is_passed_over_and_refused_as_damaged(
        missing, references, tmp_path, caplog):
    # A resume with True stopped with a FileNotFoundError where sb_rank_state_0.pt was missing, and passed over a
    # checkpoint without sb_state.pt without a word; an explicit resume of the latter was told to use
    # --sb_strategy none, which silently turned the selective run into a plain one.
    reference, output_dir, settings = references("mid_accumulation")
    previous, damaged = tmp_path / "checkpoint-2", tmp_path / "checkpoint-3"
    shutil.copytree(checkpoints(output_dir)[1], previous)
    shutil.copytree(checkpoints(output_dir)[2], damaged)
    if missing == RANK_STATE_FILE.format(rank=1):  # saved by two processes, the second one's file lost
        shared = torch.load(damaged / STATE_FILE, weights_only=True)
        torch.save({**shared, "world_size": 2}, damaged / STATE_FILE)
    else:
        os.remove(damaged / missing)
    with pytest.raises(ValueError, match=rf"^resume_from_checkpoint '{damaged}': .*{missing}.*: it is damaged"):
        new_trainer(str(tmp_path / "out"), settings).train(resume_from_checkpoint=str(damaged))
    # Without selection: refused as damaged, or as a selective run's checkpoint (its sb_state.pt says so).
    refusal = "it is damaged" if missing == STATE_FILE else "--sb_strategy: saved 'sb', now 'none'"
    with pytest.raises(ValueError, match=refusal):
        new_trainer(str(tmp_path / "plain"), {**settings, "sb_strategy": "none"}).train(
            resume_from_checkpoint=str(damaged))
    resumed = new_trainer(str(tmp_path), {**settings, "save_strategy": "no"})
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.engine.checkpoints"):
        resumed.train(resume_from_checkpoint=True)
    passed_over = [r.getMessage() for r in caplog.records if r.getMessage().startswith("passing over")]
    assert passed_over == [f"passing over {damaged}: it lacks {missing}"]
    assert_same_run(resumed, reference)  # from checkpoint-2


# ---- SIGKILL ------------------------------------------------------------------------------------


def _worker(output_dir, *args, stdin=None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    log = open(f"{output_dir}-{args[0]}.log", "w")  # a file, not a pipe: a full pipe would block the worker
    process = subprocess.Popen(
        [sys.executable, os.path.join(TESTS, "resume_worker.py"), str(output_dir), *args],
        stdin=stdin, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
    )
    process.log = log.name
    return process


def _output(process) -> str:
    with open(process.log) as handle:
        return handle.read()[-5000:]


def _complete(output_dir) -> list[str]:
    if not os.path.isdir(output_dir):
        return []
    return [c for c in checkpoints(str(output_dir)) if is_complete_checkpoint(c)]


def _watch(process, output_dir, name, **options) -> None:
    """Fail if the worker goes quiet (``launch.watch``): its progress is its log and its checkpoints."""
    hung = watch(process, lambda: (os.path.getsize(process.log), len(_complete(output_dir))), name, **options)
    assert hung is None, f"{hung}:\n{_output(process)}"


def test_sigkill_then_resume_reaches_the_uninterrupted_run(tmp_path):
    seed = int(os.environ.get("SB_KILL_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    reference = _worker(reference_dir, "fresh")
    victim = _worker(killed_dir, "fresh", "--step-sleep", "0.1")
    # The process that resumes imports now, alongside the others, and trains once told to.
    resumed = _worker(killed_dir, "resume", "--wait-stdin", stdin=subprocess.PIPE)
    try:
        wanted = rng.randint(1, 6)  # complete checkpoints to wait for, then a random extra delay
        _watch(victim, killed_dir, "the run to kill", until=lambda: len(_complete(killed_dir)) >= wanted,
               interval=0.01)
        assert victim.poll() is None, f"victim ended before the kill (seed {seed}):\n{_output(victim)}"
        time.sleep(rng.uniform(0.0, 0.15))  # land anywhere, mid-save included
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(60) == -signal.SIGKILL, f"seed {seed}"
        assert not (killed_dir / "final.pt").exists()
        assert _complete(killed_dir), f"seed {seed}"
        resumed.stdin.write("go\n")
        resumed.stdin.close()
        _watch(resumed, killed_dir, "the resumed run")
        assert resumed.returncode == 0, f"seed {seed}:\n{_output(resumed)}"
        _watch(reference, reference_dir, "the uninterrupted run")
        assert reference.returncode == 0, _output(reference)
    finally:
        for process in (victim, resumed, reference):
            if process.poll() is None:
                process.kill()
                process.wait()

    ours = torch.load(killed_dir / "final.pt", weights_only=False)
    theirs = torch.load(reference_dir / "final.pt", weights_only=False)
    assert ours["global_step"] == theirs["global_step"]
    for name in theirs["weights"]:
        assert torch.equal(ours["weights"][name], theirs["weights"][name]), (name, seed)
    assert torch.equal(ours["history"]["history"]["values"], theirs["history"]["history"]["values"])
    torch.testing.assert_close(ours["store"]["losses"], theirs["store"]["losses"], rtol=0, atol=0, equal_nan=True)
    assert ours["queue"]["rows"].keys() == theirs["queue"]["rows"].keys()
    for key, rows in theirs["queue"]["rows"].items():
        assert torch.equal(ours["queue"]["rows"][key], rows), key
    assert torch.equal(ours["generator"], theirs["generator"])
    assert torch.equal(ours["augmentation"], theirs["augmentation"])
    assert {k: ours["stats"][k] for k in COUNTERS} == {k: theirs["stats"][k] for k in COUNTERS}
