"""The record keeps the promises the trainer keeps: its writes never follow a link out of the output folder, a
record this run did not write is neither described nor uploaded as its own, and the ids it keys by are checked
before the first step as selection checks them (docs/reliability.md)."""

import fnmatch
import os
from pathlib import Path

import pytest
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer, record


def _train(output_dir, dataset=None, **overrides):
    args = make_config(output_dir, **{"sb_strategy": "none", **overrides})
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args,
                                       train_dataset=dataset if dataset is not None else make_dataset())
    trainer.train()
    return trainer


@pytest.mark.parametrize("name", [record.DATA_MAP_FILE, record.RECORD_FILE])
def test_a_link_in_the_records_place_is_replaced_and_its_target_left_unchanged(tmp_path, name):
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    users_file = tmp_path / "users_file.txt"
    users_file.write_text("mine")
    (output_dir / name).symlink_to(users_file)
    _train(str(output_dir))
    assert users_file.read_text() == "mine"
    assert not (output_dir / name).is_symlink() and (output_dir / name).stat().st_size > 0
    assert not [entry for entry in os.listdir(output_dir) if entry.endswith(".partial")]


def test_a_failed_write_leaves_the_previous_file_and_no_temporary(tmp_path):
    from hf_selective_backprop.record.files import written_in_place_of

    path = tmp_path / "table.parquet"
    path.write_text("previous")
    with pytest.raises(RuntimeError, match="disk"), written_in_place_of(str(path)) as partial:
        Path(partial).write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "previous" and os.listdir(tmp_path) == ["table.parquet"]


def _uploads(monkeypatch):
    from huggingface_hub import CommitInfo, HfApi, RepoUrl

    uploads = []

    def upload_folder(api, *, repo_id, folder_path, ignore_patterns=(), **kwargs):
        # As the Hub client does: paths matching ignore_patterns (the Trainer's "_*", "checkpoint-*") stay home.
        files = {}
        for path in Path(folder_path).rglob("*"):
            name = path.relative_to(folder_path).as_posix()
            if path.is_file() and not any(fnmatch.fnmatch(name, pattern) for pattern in ignore_patterns or ()):
                files[name] = path.read_bytes()
        uploads.append(files)
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="",
                          commit_description="", oid="0")

    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return uploads


def test_a_record_left_by_an_earlier_run_is_neither_on_the_card_nor_uploaded(tmp_path, monkeypatch):
    output_dir = str(tmp_path / "run")
    _train(output_dir)  # writes its record
    earlier = Path(output_dir, record.RECORD_FILE).read_bytes()
    uploads = _uploads(monkeypatch)
    trainer = _train(output_dir, sb_record=False, hub_model_id="you/tiny")
    trainer.push_to_hub()
    (files,) = uploads
    assert record.RECORD_FILE not in files and record.DATA_MAP_FILE not in files
    assert "## Example record" not in files["README.md"].decode()
    # Nothing the earlier run wrote is lost: set aside under a name the upload leaves out.
    assert Path(output_dir, "_previous_" + record.RECORD_FILE).read_bytes() == earlier


def _with_ids(ids):
    return make_dataset(len(ids)).add_column("index", ids)


@pytest.mark.parametrize("strategy", ["none", "sb"])
@pytest.mark.parametrize(("ids", "message"), [
    (list(range(64)) * 2, "64 duplicate ids"),
    (list(range(127)) + [10**9], "1000000000 at row 127"),
    ([-1] + list(range(1, 128)), "-1 at row 0"),
])
def test_bad_ids_under_the_record_are_refused_before_the_first_step(output_dir, strategy, ids, message):
    args = make_config(output_dir, sb_strategy=strategy)
    with pytest.raises(ValueError, match=f"--sb_index_column 'index' holds {message}"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=_with_ids(ids))
