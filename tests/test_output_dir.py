"""A safe --output_dir: rotation deletes only the run's own checkpoints, and the scripts refuse a folder in use.

The Trainer's ``save_total_limit`` rotation deletes every ``checkpoint-*`` folder of ``output_dir``;
`SelectiveBackpropTrainer` with selection on deletes only those its run (or the run it resumes) wrote
(with ``sb_strategy="none"`` it is the Trainer: tests/test_drop_in.py). `scripts/train.py`
and `scripts/train_text.py` refuse a folder that holds a finished run or other files unless told
``--overwrite_output_dir``, or ``--resume_from_checkpoint`` continues the run saved there.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.output_lock import LOCK_FILE, claimed

ROOT = Path(__file__).resolve().parents[1]
USER_FILE = "my_notes.txt"


def user_checkpoint(output_dir: Path, step: int = 5) -> Path:
    """A folder of the user's that happens to be named like a checkpoint, with the user's file inside."""
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / USER_FILE).write_text("the user's own notes")
    return folder / USER_FILE


def previous_run_checkpoint(output_dir: Path, step: int = 1000) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def checkpoint_steps(output_dir: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*"))


def train(output_dir: Path, resume=None, **overrides) -> SelectiveBackpropTrainer:
    settings = dict(save_strategy="steps", save_steps=2, save_total_limit=1, num_train_epochs=2)
    settings.update(overrides)
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), args=make_config(str(output_dir), **settings), train_dataset=make_dataset(64),
        eval_dataset=make_dataset(16, seed=1) if settings.get("eval_strategy", "no") != "no" else None,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


# ---- rotation through the Python API ------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["sb", "uniform"])
def test_rotation_deletes_only_checkpoints_the_run_wrote(strategy, tmp_path):
    out = tmp_path / "out"
    notes = user_checkpoint(out)
    previous = previous_run_checkpoint(out)
    trainer = train(out, sb_strategy=strategy)
    assert notes.read_text() == "the user's own notes"  # the Trainer's rotation deleted it, oldest first
    assert previous.is_dir()
    own = [step for step in checkpoint_steps(out) if step not in (5, 1000)]
    assert len(own) == 1 and trainer.state.global_step - 2 < own[0] <= trainer.state.global_step


def test_a_resumed_run_rotates_the_checkpoints_of_the_run_it_continues(tmp_path):
    out = tmp_path / "out"
    notes = user_checkpoint(out)
    train(out, save_total_limit=2)
    saved = [step for step in checkpoint_steps(out) if step != 5]
    assert len(saved) == 2
    resumed = train(out, resume=str(out / f"checkpoint-{saved[0]}"), save_total_limit=2, num_train_epochs=4)
    own = [step for step in checkpoint_steps(out) if step != 5]
    # Both of the first run's checkpoints rotated out by the two newest saves of the resumed run.
    assert len(own) == 2 and saved[1] < own[0] < own[1] <= resumed.state.global_step
    assert notes.read_text() == "the user's own notes"


def test_a_resume_from_another_folders_checkpoint_rotates_none_of_this_folders(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    train(first, save_total_limit=None, num_train_epochs=3)
    steps = checkpoint_steps(first)
    assert len(steps) >= 2
    # The user's folder here bears the name of a step the first run saved there.
    notes = user_checkpoint(second, steps[0])
    resumed = train(second, resume=str(first / f"checkpoint-{steps[-1]}"), save_total_limit=1, num_train_epochs=6)
    assert notes.read_text() == "the user's own notes"
    own = [step for step in checkpoint_steps(second) if step != steps[0]]
    assert len(own) == 1 and steps[-1] < own[0] <= resumed.state.global_step
    assert checkpoint_steps(first) == steps


def shard(checkpoint: Path) -> None:
    """Turn the checkpoint's model.safetensors into one shard per tensor and an index, as a sharded save writes."""
    from safetensors.torch import load_file, save_file

    weights = load_file(checkpoint / "model.safetensors")
    (checkpoint / "model.safetensors").unlink()
    names = {key: f"model-{i + 1:05d}-of-{len(weights):05d}.safetensors" for i, key in enumerate(weights)}
    for key, name in names.items():
        save_file({key: weights[key]}, checkpoint / name)
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))


def recorded_steps(checkpoint: Path) -> list[int]:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["stateful_callbacks"]["RunCheckpoints"]["attributes"]["steps"]


def test_a_resume_from_a_sharded_checkpoint_records_the_later_checkpoints_as_the_uninterrupted_run(tmp_path):
    # The later folders hold model.safetensors, which the sharded one resumed from does not: they went
    # unrecorded, so rotation no longer managed them.
    out = tmp_path / "out"
    train(out, save_total_limit=None, num_train_epochs=3)
    steps = checkpoint_steps(out)
    assert len(steps) >= 3
    uninterrupted = recorded_steps(out / f"checkpoint-{steps[-1]}")
    assert uninterrupted == steps
    shard(out / f"checkpoint-{steps[0]}")
    train(out, resume=str(out / f"checkpoint-{steps[0]}"), save_total_limit=None, num_train_epochs=3)
    assert checkpoint_steps(out) == steps
    assert recorded_steps(out / f"checkpoint-{steps[-1]}") == uninterrupted


def test_keeping_only_the_best_checkpoint_at_the_end_spares_other_folders(tmp_path):
    # With load_best_model_at_end and save_total_limit=1 the Trainer deletes every checkpoint but the best.
    out = tmp_path / "out"
    notes = user_checkpoint(out)
    # Keeping every row, the run saves at even steps only: none lands in the user's checkpoint-5.
    trainer = train(out, sb_strategy="uniform", sb_keep=1.0, eval_strategy="steps", eval_steps=2,
                    load_best_model_at_end=True,
                    metric_for_best_model="loss")
    assert notes.read_text() == "the user's own notes"
    assert checkpoint_steps(out) == sorted([5, int(Path(trainer.state.best_model_checkpoint).name.split("-")[1])])
    assert trainer.args.save_total_limit == 1  # hidden from the Trainer's sweep only while it ran


# ---- the scripts refuse a folder in use -----------------------------------------------------------


IMAGE_ARGS = ["--dataset", "digits", "--model", "resnet18", "--image_size", "8", "--max_train_samples", "64",
              "--eval_split", "none", "--eval_strategy", "no", "--per_device_train_batch_size", "16",
              "--num_train_epochs", "1", "--sb_strategy", "sb", "--sb_keep", "0.5", "--augment", "False",
              "--use_cpu", "--disable_tqdm", "true", "--logging_steps", "1000"]
TEXT_ARGS = ["--label_column", "sentiment", "--vocab_size", "80", "--hidden_size", "16", "--num_heads", "2",
             "--num_layers", "1", "--intermediate_size", "32", "--max_length", "16",
             "--per_device_train_batch_size", "16", "--num_train_epochs", "1", "--eval_split", "none",
             "--eval_strategy", "no", "--use_cpu", "--disable_tqdm", "true", "--logging_steps", "1000"]


@pytest.fixture(params=["train.py", "train_text.py"])
def script(request, review_folder, monkeypatch):
    """Runs one of the scripts with its arguments (tiny data), counting how often it loads data."""
    name = request.param
    loads = []
    if name == "train.py":
        import hf_selective_backprop.workflow as module

        loader, attribute, common = module.load_image_data, "load_image_data", IMAGE_ARGS
    else:
        import hf_selective_backprop.data.text as module

        loader, attribute, common = module.load_text_data, "load_text_data", [
            "--dataset", str(review_folder), *TEXT_ARGS]

    def counted(*args, **kwargs):
        loads.append(1)
        return loader(*args, **kwargs)

    monkeypatch.setattr(module, attribute, counted)

    def run(output_dir: Path, *extra: str) -> None:
        monkeypatch.setattr(sys, "argv", [name, *common, "--output_dir", str(output_dir), *extra])
        runpy.run_path(str(ROOT / "scripts" / name), run_name="__main__")

    run.loads = loads
    run.name = name
    return run


def test_a_finished_run_is_not_overwritten_without_the_flag(script, tmp_path):
    out = tmp_path / "run"
    script(out, "--save_strategy", "no")
    finished = {name: (out / name).read_bytes() for name in ("model.safetensors", "README.md")}
    before = sorted(path.name for path in out.iterdir())
    loads = len(script.loads)
    with pytest.raises(ValueError, match=r"^--output_dir '.*run' already holds a finished run \(model.safetensors\) "
                       r"and other files \(.*README.md.*\), which a new run would overwrite. Pass "
                       r"--overwrite_output_dir to train into it anyway"):
        script(out, "--save_strategy", "no")
    assert len(script.loads) == loads  # refused before any data was loaded
    assert sorted(path.name for path in out.iterdir()) == before
    assert all((out / name).read_bytes() == content for name, content in finished.items())

    script(out, "--save_strategy", "no", "--overwrite_output_dir")  # the flag allows it
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_a_run_ends_as_the_hugging_face_example_scripts_with_its_metrics_files(script, tmp_path, capsys):
    # Issue 76: scripts/train.py evaluated at the end but wrote no eval_results.json or all_results.json.
    out = tmp_path / "run"
    split = "test" if script.name == "train.py" else "validation"
    script(out, "--save_strategy", "no", "--eval_split", split, "--max_eval_samples", "4")
    evaluation = json.loads((out / "eval_results.json").read_text())
    assert 0.0 <= evaluation["eval_accuracy"] <= 1.0 and evaluation["eval_loss"] > 0
    assert evaluation["eval_samples"] == 4
    training = json.loads((out / "train_results.json").read_text())
    assert training["train_runtime"] > 0 and training["train_samples"] == (64 if script.name == "train.py" else 96)
    assert json.loads((out / "all_results.json").read_text()) == {**training, **evaluation}
    state = json.loads((out / "trainer_state.json").read_text())
    assert any("train_runtime" in entry for entry in state["log_history"])
    printed = capsys.readouterr().out  # trainer.log_metrics, as the example scripts print them
    assert "***** train metrics *****" in printed and "***** eval metrics *****" in printed

    # Without an evaluation split there is nothing to evaluate: no eval_results.json, and all_results.json is train's.
    script(tmp_path / "plain", "--save_strategy", "no")
    assert not (tmp_path / "plain" / "eval_results.json").exists()
    assert json.loads((tmp_path / "plain" / "all_results.json").read_text()) == json.loads(
        (tmp_path / "plain" / "train_results.json").read_text())


def test_a_users_checkpoint_folder_survives_and_an_unfinished_run_resumes_only_when_asked(script, tmp_path):
    out = tmp_path / "run"
    notes = user_checkpoint(out)
    with pytest.raises(ValueError, match=r"already holds checkpoints \(checkpoint-5\), which a new run would "
                       r"overwrite. Pass --resume_from_checkpoint True to continue the run saved there, "
                       r"--overwrite_output_dir"):
        script(out, "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1")
    assert not script.loads
    script(out, "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1", "--overwrite_output_dir")
    assert notes.read_text() == "the user's own notes"
    steps = checkpoint_steps(out)
    assert len(steps) == 2 and 5 in steps  # the user's folder and the run's last checkpoint

    # A resume into the run's own folder needs no flag.
    last = out / f"checkpoint-{max(step for step in steps if step != 5)}"
    script(out, "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1",
           "--resume_from_checkpoint", str(last), "--num_train_epochs", "2")
    assert notes.read_text() == "the user's own notes"
    assert len(checkpoint_steps(out)) == 2 and max(checkpoint_steps(out)) > int(last.name.split("-")[1])


@pytest.mark.parametrize("strategy", ["sb", "none"])
def test_a_resume_with_another_model_flag_is_refused_before_any_data_is_read(script, tmp_path, strategy):
    # A run without selection (no sb_state.pt) records its model flags in trainer_state.json: its resume used to
    # fail on the weights with torch's raw size mismatch, after the data was loaded.
    out = tmp_path / "run"
    script(out, "--save_strategy", "steps", "--save_steps", "1", "--sb_strategy", strategy)
    last = max(out.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    loads = len(script.loads)
    # A later flag overrides the common arguments' one.
    flag, saved, now = ("--model", "'resnet18'", "resnet34") if script.name == "train.py" else ("--num_layers", 1, 2)
    with pytest.raises(ValueError, match=rf"^Cannot resume from .*{last.name}: the model flags differ from the saved "
                       rf"run's:\n  {flag}: saved {saved}, now '?{now}'?\n.*resume with the saved values"):
        script(out, "--save_strategy", "steps", "--save_steps", "1", "--resume_from_checkpoint", str(last),
               flag, str(now), "--num_train_epochs", "2", "--sb_strategy", strategy)
    assert len(script.loads) == loads  # refused before any data was loaded
    # The same flags continue the run.
    script(out, "--save_strategy", "steps", "--save_steps", "1", "--resume_from_checkpoint", str(last),
           "--num_train_epochs", "2", "--sb_strategy", strategy)
    assert max(checkpoint_steps(out)) > int(last.name.split("-")[1])


def test_a_plain_checkpoint_without_the_run_signature_is_refused_for_another_model(script, tmp_path):
    # A checkpoint of a run without selection saved before the run record: no flags to compare before the data, and
    # the resume ended in torch's raw size mismatch (or the optimizer's parameter-group error).
    out = tmp_path / "run"
    script(out, "--save_strategy", "steps", "--save_steps", "1", "--sb_strategy", "none")
    last = max(out.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    del state["stateful_callbacks"]["PlainRunSignature"]  # as an earlier version saved it
    (last / "trainer_state.json").write_text(json.dumps(state))
    flag, now, field, saved, wants = (
        ("--model", "resnet34", "architecture", "'resnet18'", "'resnet34'") if script.name == "train.py"
        else ("--num_layers", "2", "num_hidden_layers", 1, 2))
    with pytest.raises(ValueError, match=rf"^Cannot resume from .*{last.name}: this run's model differs from the saved "
                       rf"one:\n  the model's {field}: saved {saved}, now {wants}\n"):
        script(out, "--resume_from_checkpoint", str(last), flag, now, "--num_train_epochs", "2",
               "--sb_strategy", "none")


def test_a_plain_budget_runs_resume_with_another_budget_is_refused_before_any_data_is_read(script, tmp_path):
    out = tmp_path / "run"
    run = ("--save_strategy", "steps", "--save_steps", "1", "--sb_strategy", "none", "--num_train_epochs", "2")
    script(out, *run, "--sb_budget", "0.5")
    first = min(out.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    loads = len(script.loads)
    with pytest.raises(ValueError, match=r"this run's budget differs from the saved run's:\n  --sb_budget: saved 0.5, "
                       r"now 0.75\n"):
        script(out, *run, "--sb_budget", "0.75", "--resume_from_checkpoint", str(first))
    assert len(script.loads) == loads


# ---- one run per folder ---------------------------------------------------------------------------


def test_a_folder_another_run_is_writing_is_refused_before_any_data_is_read(script, tmp_path):
    out = tmp_path / "run"
    with claimed(str(out)):  # a run in progress (this process: alive) holds the folder
        with pytest.raises(ValueError, match=rf"^--output_dir '.*run' is in use by another run \(process "
                           rf"{os.getpid()} on .*\): two runs would overwrite"):
            script(out, "--save_strategy", "no", "--overwrite_output_dir")
        assert not script.loads
    assert not (out / LOCK_FILE).exists()  # released on exit
    script(out, "--save_strategy", "no")  # an empty folder but for a released lock is free
    assert (out / "model.safetensors").is_file() and not (out / LOCK_FILE).exists()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": gone.pid}))
    with caplog.at_level(logging.WARNING, logger="hf_selective_backprop.output_lock"), claimed(str(out)):
        assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert any("taking over the lock of a run that is gone" in r.getMessage() for r in caplog.records)
    assert not (out / LOCK_FILE).exists()


def _contend(output_dir: str, barrier, owners) -> None:
    """One of several processes started together: try to claim the folder, hold it until all have tried."""
    from hf_selective_backprop.output_lock import _claim, _release

    barrier.wait()
    try:
        lock = _claim(output_dir)
    except ValueError:
        lock = None
    else:
        with owners.get_lock():
            owners.value += 1
    barrier.wait()  # every process has tried while the owner still holds the folder
    if lock is not None:
        _release(lock)


@pytest.mark.parametrize("stale", [True, False], ids=["stale-lock", "empty-folder"])
def test_processes_started_together_claim_a_folder_exactly_once(stale, tmp_path):
    # Taking over a stale lock by deleting it and creating another let two processes that both found it
    # own the folder at once; each trial here must end with exactly one owner.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    processes, trials = 4, 30
    for trial in range(trials):
        out = tmp_path / f"run{trial}"
        out.mkdir()
        if stale:
            (out / LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": gone.pid}))
        barrier, owners = context.Barrier(processes), context.Value("i", 0)
        workers = [context.Process(target=_contend, args=(str(out), barrier, owners)) for _ in range(processes)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
        assert all(worker.exitcode == 0 for worker in workers)
        assert owners.value == 1, f"trial {trial}: {owners.value} processes own the folder"
        assert not (out / LOCK_FILE).exists()  # the owner released it


@pytest.mark.parametrize("kind, what", [
    ("symlink", "a symbolic link"), ("dangling-symlink", "a symbolic link"), ("fifo", "a FIFO"),
    ("directory", "a directory"),
])
def test_a_lock_path_that_is_not_a_lock_file_is_refused_and_left_alone(kind, what, tmp_path):
    # A symbolic link was followed (the file it named, outside the output folder, was overwritten or created), a
    # FIFO hung the claim for good and a directory gave a raw IsADirectoryError. A process of its own, so that a
    # hang fails the test instead of stopping the suite.
    out, outside = tmp_path / "run", tmp_path / "elsewhere.txt"
    out.mkdir()
    lock = out / LOCK_FILE
    if kind == "symlink":
        outside.write_text("the user's own file")
    if kind.endswith("symlink"):
        lock.symlink_to(outside)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    code = f"from hf_selective_backprop.output_lock import claimed\nwith claimed({str(out)!r}):\n    pass"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"ValueError: --output_dir '{out}': {lock} is {what}, not the lock file a run keeps "
                              "there (a regular file): delete it, or choose another --output_dir"), message
    assert (outside.read_text() == "the user's own file") if kind == "symlink" else not outside.exists()
    assert lock.is_symlink() if kind.endswith("symlink") else lock.exists()


# ---- scripts/train_tokenizer.py ---------------------------------------------------------------------


@pytest.fixture
def tokenizer_script(review_folder, monkeypatch):
    """Runs scripts/train_tokenizer.py on tiny data, counting how often it loads data."""
    import hf_selective_backprop.data.text as module

    loader, loads = module.load_text_data, []

    def counted(*args, **kwargs):
        loads.append(1)
        return loader(*args, **kwargs)

    monkeypatch.setattr(module, "load_text_data", counted)

    def run(output_dir: Path, *extra: str) -> None:
        monkeypatch.setattr(sys, "argv", ["train_tokenizer.py", "--dataset", str(review_folder), "--label_column",
                                          "sentiment", "--vocab_size", "60", "--max_length", "16",
                                          "--output_dir", str(output_dir), *extra])
        runpy.run_path(str(ROOT / "scripts" / "train_tokenizer.py"), run_name="__main__")

    run.loads = loads
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def test_the_tokenizer_script_refuses_a_finished_runs_folder_unless_told(tokenizer_script, tmp_path):
    # It replaced a finished model's tokenizer.json without a word (exit 0), leaving a tokenizer that did not fit
    # the model's embedding.
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"the finished run's weights")
    (out / "tokenizer.json").write_text("the finished run's tokenizer")
    before = _files(out)
    with pytest.raises(ValueError, match=r"^--output_dir '.*model' already holds a finished run \(model.safetensors\) "
                       r"and other files \(tokenizer.json\), which a new run would overwrite. Pass "
                       r"--overwrite_output_dir to train into it anyway"):
        tokenizer_script(out)
    assert not tokenizer_script.loads and _files(out) == before  # refused before the text was read
    # A folder of checkpoints: the script has no --resume_from_checkpoint, so the refusal does not name it.
    user_checkpoint(tmp_path / "checkpoints")
    with pytest.raises(ValueError, match=r"already holds checkpoints \(checkpoint-5\).*Pass --overwrite_output_dir") \
            as refused:
        tokenizer_script(tmp_path / "checkpoints")
    assert "--resume_from_checkpoint" not in str(refused.value)
    tokenizer_script(out, "--overwrite_output_dir")
    assert (out / "model.safetensors").read_bytes() == before["model.safetensors"]
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "WordPiece"
    assert sorted(path.name for path in out.iterdir() if path.name.startswith(".")) == []  # no staging folder left


def test_the_tokenizer_script_follows_no_symbolic_link_out_of_its_folder(tokenizer_script, tmp_path):
    # A link planted at tokenizer.json was followed: the file outside the folder was overwritten.
    out, outside = tmp_path / "tok", tmp_path / "elsewhere.json"
    out.mkdir()
    outside.write_text("the user's own file")
    (out / "tokenizer.json").symlink_to(outside)
    with pytest.raises(ValueError, match=r"already holds files \(tokenizer.json\)"):
        tokenizer_script(out)
    tokenizer_script(out, "--overwrite_output_dir")
    assert outside.read_text() == "the user's own file"
    assert not (out / "tokenizer.json").is_symlink()
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "WordPiece"


def test_the_tokenizer_script_refuses_a_file_and_a_folder_in_use(tokenizer_script, tmp_path):
    # --output_dir naming a file printed "... tokens -> <file>" and exited 0, having saved nothing.
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's own notes")
    with pytest.raises(ValueError, match=r"^--output_dir '.*notes.txt' is a file, not a folder"):
        tokenizer_script(notes)
    assert notes.read_text() == "the user's own notes"
    out = tmp_path / "tok"
    with claimed(str(out)):
        with pytest.raises(ValueError, match=r"^--output_dir '.*tok' is in use by another run"):
            tokenizer_script(out)
    assert not tokenizer_script.loads
    tokenizer_script(out)
    assert (out / "tokenizer.json").is_file() and not (out / LOCK_FILE).exists()
