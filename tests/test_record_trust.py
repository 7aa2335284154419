"""The record keeps the promises the trainer keeps: its writes never follow a link out of the output folder, a
record this run did not write is neither described nor uploaded as its own, and the ids it keys by are checked
before the first step as selection checks them (docs/reliability.md)."""

import fnmatch
import os
from pathlib import Path

import pytest
from tiny import TinyClassifier, make_config, make_dataset

import hf_selective_backprop
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


# ---- reading a record: what the record functions and --sb_subset_from refuse, naming the argument or flag ----


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run's output folder holding its record: 2 epochs on make_dataset()'s 256 rows, ids by position."""
    output_dir = str(tmp_path_factory.mktemp("recorded") / "run")
    _train(output_dir)
    return output_dir


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    output_dir = str(tmp_path_factory.mktemp("one_epoch") / "run")
    _train(output_dir, num_train_epochs=1)
    return output_dir


def _subset_trainer(output_dir, source, dataset=None, model=None, **flags):
    args = make_config(output_dir, sb_strategy="none", sb_subset_from=source, **{"sb_subset_keep": 0.5, **flags})
    return SelectiveBackpropTrainer(model=model or TinyClassifier(), args=args,
                                    train_dataset=dataset if dataset is not None else make_dataset())


def _no_hub(monkeypatch):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError("a path was sent to the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)


@pytest.mark.parametrize("source", ["./no/such/run", "no/such/run", "/no/such/run", "runs/missing.parquet"])
def test_a_missing_path_is_said_not_to_exist_and_never_sent_to_the_hub(monkeypatch, output_dir, source):
    _no_hub(monkeypatch)
    with pytest.raises(FileNotFoundError, match=f"{source} does not exist"):
        record.load_record(source)
    with pytest.raises(FileNotFoundError, match=f"{source} does not exist"):
        record.prune(make_dataset(with_index=True), source, keep=0.5)
    with pytest.raises(ValueError, match=f"--sb_subset_from '{source}': .* does not exist"):
        _subset_trainer(output_dir, source)


def test_a_hub_id_that_cannot_be_read_says_it_is_neither_a_local_path_nor_a_readable_repository(monkeypatch):
    import huggingface_hub

    def not_found(*args, **kwargs):
        raise OSError("404: no such repository")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_found)
    with pytest.raises(FileNotFoundError, match="you/missing is no local file or folder, and no example_record.parquet "
                                                "could be read from a Hub repository of that name .*404"):
        record.load_record("you/missing")


def test_a_parquet_that_is_not_a_record_is_refused_naming_the_missing_columns(tmp_path):
    from datasets import Dataset

    path = str(tmp_path / "other.parquet")
    Dataset.from_dict({"idx": [0, 1], "mean_loss": [0.1, 0.2]}).to_parquet(path)
    with pytest.raises(ValueError, match=r"other.parquet has no \['times_scored', .*'region'\] column\(s\), which an "
                                         "example record holds"):
        record.load_record(path)
    (tmp_path / "text.parquet").write_text("not a table")
    with pytest.raises(ValueError, match="text.parquet is not a parquet table"):
        record.load_record(str(tmp_path / "text.parquet"))


def _rewritten(recorded, tmp_path, change, keep_metadata=True):
    """The recorded run's table, passed through ``change`` (a pyarrow.Table to pyarrow.Table), written apart."""
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(os.path.join(recorded, record.RECORD_FILE))
    if not keep_metadata:  # as an earlier version wrote it: datasets' own entry only
        table = table.replace_schema_metadata({b"huggingface": table.schema.metadata[b"huggingface"]})
    path = str(tmp_path / "changed.parquet")
    pyarrow.parquet.write_table(change(table), path)
    return path


def test_a_record_of_no_row_is_refused_as_holding_no_example(recorded, tmp_path):
    from datasets import Dataset

    path = _rewritten(recorded, tmp_path, lambda table: table.slice(0, 0))
    with pytest.raises(ValueError, match="changed.parquet holds no example"):
        record.load_record(path)
    empty = Dataset.from_dict({"index": [], "last_loss": []})
    with pytest.raises(ValueError, match="table holds no example"):
        record.label_issues(empty)


def test_a_record_with_an_id_twice_is_refused_naming_the_id_column_and_the_id(recorded, tmp_path):
    import pyarrow
    from datasets import Dataset

    path = _rewritten(recorded, tmp_path, lambda table: pyarrow.concat_tables([table, table.slice(5, 1)]))
    with pytest.raises(ValueError, match=r"holds 1 duplicate ids in its 'index' column \(e.g. 5, 2 times\)"):
        record.load_record(path)
    twice = Dataset.from_dict({"index": [0, 1, 1], "mean_loss": [0.1, 0.2, 0.3]})
    with pytest.raises(ValueError, match=r"the record holds 1 duplicate ids in its 'index' column \(e.g. 1"):
        record.prune(make_dataset(3, with_index=True), twice, keep=1.0)


def test_the_record_holds_a_fingerprint_of_its_data_and_passes_on_that_data_its_subsets_and_moved_rows_with_ids(
        recorded):
    from hf_selective_backprop.record.files import record_metadata

    table = record.load_record(recorded)
    saved = record_metadata(table)
    assert saved["version"] == hf_selective_backprop.__version__  # which release wrote it
    assert saved["id_column"] == "index" and saved["data"]["column"] == "labels"
    assert saved["data"]["examples"] == 256 and len(saved["data"]["labels"]) == 64
    data = make_dataset(with_index=True)
    assert len(record.prune(data, table, keep=0.5)) == 128
    assert len(record.prune(data.shuffle(seed=0), table, keep=0.5)) == 128  # rows moved with their ids
    assert len(record.prune(data.select(range(100)), table, keep=0.5)) == 50  # a subset of that data


@pytest.mark.parametrize("other", ["another_dataset", "moved_rows"])
def test_a_record_used_on_other_data_is_refused_naming_the_mismatch(recorded, output_dir, other):
    # Ids by position: any dataset of 256 rows joins the record on ids 0..255, whatever its rows are.
    data = make_dataset(seed=1) if other == "another_dataset" else make_dataset().shuffle(seed=0)
    message = (r"the record was written on other data: \d+ of the 64 examples its fingerprint samples hold another "
               r"'labels' here \(ids \[.*\]\); it was written on 256 examples, this dataset has 256")
    with pytest.raises(ValueError, match=f"--sb_subset_from '{recorded}': {message}"):
        _subset_trainer(output_dir, recorded, dataset=data)
    with pytest.raises(ValueError, match=message):
        record.prune(data.add_column("index", list(range(256))), record.load_record(recorded), keep=0.5)


def test_a_record_without_a_fingerprint_warns_and_is_used(recorded, tmp_path, caplog):
    path = _rewritten(recorded, tmp_path, lambda table: table, keep_metadata=False)
    trainer = _subset_trainer(str(tmp_path / "run"), path)
    assert len(trainer.train_dataset) == 128
    assert "the record holds no fingerprint of the data it was written on" in caplog.text


@pytest.mark.parametrize("score", ["variability", "forgetting_events"])
def test_a_score_with_one_value_everywhere_is_refused_naming_it(one_epoch, output_dir, score):
    # One epoch scores each example once: no spread, no forgetting; the 'highest' would be a random subset.
    message = (f"by \\(--sb_subset_by\\) '{score}': the record's '{score}' is 0 for every example, so the subset it "
               "keeps would be a random one: choose a score that varies \\(e.g. --sb_subset_by mean_loss\\), or "
               "record more epochs")
    with pytest.raises(ValueError, match=message):
        _subset_trainer(output_dir, one_epoch, sb_subset_by=score)
    with pytest.raises(ValueError, match=message):
        record.prune(make_dataset(with_index=True), one_epoch, keep=0.5, by=score)


def test_a_score_never_measured_is_refused_naming_it():
    from datasets import Dataset

    table = Dataset.from_dict({"index": [0, 1, 2], "mean_loss": [float("nan")] * 3})
    with pytest.raises(ValueError, match="the record's 'mean_loss' is NaN \\(never measured\\) for every example"):
        record.prune(make_dataset(3, with_index=True), table, keep=1.0)


def test_a_subset_of_one_example_is_refused_naming_the_keep(recorded, output_dir):
    message = "keeps 1 of 256 examples: a subset needs at least 2"
    with pytest.raises(ValueError, match=f"keep \\(--sb_subset_keep\\) 0.004 {message}"):
        _subset_trainer(output_dir, recorded, model=TinyClassifier(batch_norm=True), sb_subset_keep=0.004)
    with pytest.raises(ValueError, match=f"keep \\(--sb_subset_keep\\) 0.004 {message}"):
        record.prune(make_dataset(with_index=True), recorded, keep=0.004)


def _wrong_arguments(recorded, tmp_path):
    table, data = record.load_record(recorded), make_dataset(with_index=True)
    frame = "got a pandas.DataFrame: datasets.Dataset.from_pandas"
    return [
        (lambda: record.prune(data, table.to_pandas(), 0.5), TypeError, f"table must be the record as a .*{frame}"),
        (lambda: record.prune(data.to_pandas(), table, 0.5), TypeError, f"dataset must be .*{frame}"),
        (lambda: record.prune(data, table, "0.5"), TypeError, r"keep \(--sb_subset_keep\) must be a number"),
        (lambda: record.prune(data, table, True), TypeError, r"keep \(--sb_subset_keep\) must be a number"),
        (lambda: record.prune(data, table, 0.5, by=None), TypeError, r"by \(--sb_subset_by\) must be a string"),
        (lambda: record.prune(data, table, 0.5, seed="1"), TypeError, "seed must be an integer"),
        (lambda: record.prune(data, table, 0.5, id_column=0), TypeError, "id_column must be the name"),
        (lambda: record.label_issues(table, top="10"), TypeError, "top must be None or a positive integer"),
        (lambda: record.label_issues(table, top=-1), ValueError, "top must be a positive number of rows"),
        (lambda: record.label_issues(table, top=0), ValueError, "top must be a positive number of rows"),
        (lambda: record.label_issues(table, by=3), TypeError, "by must be a string, one of mean_loss"),
        (lambda: record.label_issues(table.to_pandas()), TypeError, f"table must be .*{frame}"),
        (lambda: record.load_record(3), TypeError, "source must be a path"),
        (lambda: record.load_record(recorded, revision=1), TypeError, "revision must be None or a Hub revision"),
        (lambda: record.data_map(table, 3), TypeError, "path must be where to write the figure"),
        (lambda: record.data_map(table, str(tmp_path / "m.png"), title=1), TypeError, "title must be None or a str"),
        (lambda: record.record_dataset("run"), TypeError, "record must be an ExampleRecord"),
    ]


def test_wrong_arguments_to_the_record_functions_are_named(recorded, tmp_path):
    for call, error, message in _wrong_arguments(recorded, tmp_path):
        with pytest.raises(error, match=message):
            call()
    # A table may be given as where load_record reads it.
    assert len(record.prune(make_dataset(with_index=True), Path(recorded), keep=0.5)) == 128


def _disagreeing_record():
    from datasets import Dataset

    nan = float("nan")
    # Row 0: unlearned at its last scoring only; 1: in the hard-to-learn corner; 2: ambiguous, low confidence;
    # 3: learned by every score; 4: never scored.
    return Dataset.from_dict({
        "index": [0, 1, 2, 3, 4], "last_loss": [2.0, 0.1, 1.0, 0.2, nan], "mean_loss": [0.3, 1.5, 1.0, 0.2, nan],
        "confidence": [0.70, 0.30, 0.40, 0.85, nan], "variability": [0.0, 0.0, 0.3, 0.0, nan],
        "aum": [1.0, -0.5, 0.2, 2.0, nan],
        "region": [record.EASY, record.HARD, record.AMBIGUOUS, record.EASY, None],
    })


@pytest.mark.parametrize(("by", "flagged"), [
    ("last_loss", [0, 2]), ("mean_loss", [1, 2]), ("confidence", [1, 2]), ("aum", [1]),
])
def test_label_issues_flag_by_the_chosen_score_and_top_is_the_first_rows_of_the_same_list(by, flagged):
    table = _disagreeing_record()
    issues = record.label_issues(table, by=by)
    assert issues["index"] == flagged and issues["label_issue_rank"] == list(range(len(flagged)))
    for top in range(1, len(table) + 1):
        first = record.label_issues(table, top=top, by=by)
        assert first["index"][: len(flagged)] == flagged[:top]
        assert first["label_issue_rank"] == list(range(top))


def test_an_example_whose_every_loss_was_non_finite_keeps_its_row_and_count():
    import torch

    from hf_selective_backprop.record.scores import RECORD_COLUMNS
    from hf_selective_backprop.record.table import SCORED, ExampleRecord

    kept = ExampleRecord()
    kept.apply(torch.tensor([0, 1, 0]), torch.tensor([float("nan"), 0.5, float("inf")]), torch.tensor([SCORED] * 3),
               torch.tensor([0, 0, 1]))
    table = record.record_dataset(kept, "index")
    assert table.column_names == ["index", *RECORD_COLUMNS]
    assert table["index"] == [0, 1] and table["nonfinite_losses"] == [2, 0] and table["times_scored"] == [0, 1]
    assert table["region"][0] is None


def test_an_image_datasets_fingerprint_reads_its_label_tensor_through_a_subset_without_loading_rows():
    import numpy
    import torch
    from tiny import make_image_dataset

    from hf_selective_backprop.record.fingerprint import check_same_data, data_fingerprint

    images = make_image_dataset(200)
    images.__getitems__ = None  # loading a row would augment it, drawing from the dataset's generator
    subset = torch.utils.data.Subset(images, list(range(50, 200)))
    saved = data_fingerprint(subset, "index")
    assert saved["column"] == "labels" and saved["examples"] == 150 and min(map(int, saved["labels"])) == 50
    check_same_data(saved, images, numpy.arange(200), "here")  # the full set holds the subset's examples as they were
    moved = make_image_dataset(200)
    moved.labels = moved.labels.roll(1)  # ids by position over other rows
    with pytest.raises(ValueError, match="here: the record was written on other data"):
        check_same_data(saved, moved, numpy.arange(200), "here")


# ---- the record's resume -------------------------------------------------------------------------------------

def _checkpointed(output_dir, dataset, strategy="none", **overrides):
    """A run of 2 epochs saving each epoch, and its first epoch's checkpoint."""
    trainer = _train(output_dir, dataset, sb_strategy=strategy, save_strategy="epoch", **overrides)
    (first, *_) = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return trainer, first


def _resume(output_dir, checkpoint, dataset, caplog, **overrides):
    import logging

    args = make_config(output_dir, **{"sb_strategy": "none", "save_strategy": "epoch", **overrides})
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=dataset)
    with caplog.at_level(logging.WARNING):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    table = record.load_record(output_dir)
    from hf_selective_backprop.record.files import record_metadata
    return table, record_metadata(table)


def test_a_checkpoint_that_lost_its_record_resumes_into_a_record_that_says_it_is_partial(tmp_path, caplog):
    data = make_dataset(64)
    _, checkpoint = _checkpointed(str(tmp_path / "run"), data)
    (checkpoint / "sb_record.pt").unlink()
    _, metadata = _resume(str(tmp_path / "run"), checkpoint, data, caplog)
    assert metadata["complete"] is False
    assert "or the file was removed" in caplog.text and "complete: false" in caplog.text
    whole = record.load_record(str(_checkpointed(str(tmp_path / "whole"), data)[0].args.output_dir))
    from hf_selective_backprop.record.files import record_metadata
    assert record_metadata(whole)["complete"] is True


def test_another_datasets_record_in_a_checkpoint_is_not_merged(tmp_path, caplog):
    data, other = make_dataset(64, seed=0), make_dataset(64, seed=5)
    _, checkpoint = _checkpointed(str(tmp_path / "run"), data)
    _, foreign = _checkpointed(str(tmp_path / "other"), other)
    (checkpoint / "sb_record.pt").write_bytes((foreign / "sb_record.pt").read_bytes())
    table, metadata = _resume(str(tmp_path / "run"), checkpoint, data, caplog)
    assert "was written on other data" in caplog.text and metadata["complete"] is False
    assert max(table["times_backpropagated"]) == 1  # only the epoch after the resume: nothing merged


@pytest.mark.parametrize("turned", ["on", "off"])
def test_a_resume_may_turn_the_record_on_or_off(tmp_path, caplog, turned):
    data = make_dataset(64)
    _, checkpoint = _checkpointed(str(tmp_path / "run"), data, strategy="sb", sb_record=turned == "off")
    args = make_config(str(tmp_path / "run"), sb_strategy="sb", save_strategy="epoch", sb_record=turned == "on")
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=data)
    with pytest.warns(UserWarning, match="sb_record: saved"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert (tmp_path / "run" / record.RECORD_FILE).exists() == (turned == "on")


def test_a_full_disk_while_the_record_is_written_leaves_train_to_finish(tmp_path, monkeypatch, caplog):
    import errno
    import logging

    import pyarrow.parquet

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pyarrow.parquet, "write_table", full_disk)
    with caplog.at_level(logging.ERROR):
        trainer = _train(str(tmp_path / "run"))
    assert trainer.state.global_step > 0 and trainer.sb_stats["backwards"] > 0
    assert "could not be written to" in caplog.text and record.RECORD_FILE in caplog.text
    assert not (tmp_path / "run" / record.RECORD_FILE).exists()


def test_the_label_issue_count_is_confident_learnings_calibrated_count_per_class():
    """Two classes, where the count is confident learning's own: class 0's threshold is its mean confidence 0.58, so
    its four rows at 0.9 are confidently 0; its two at 0.1 reach class 1's threshold 0.74 (1 - 0.1 >= 0.74) and are
    confidently 1; its four at 0.5 reach neither. Calibrated to the class's ten rows: 10 x 2 / 6 = 3.3, so 3."""
    import numpy

    from hf_selective_backprop.record.confident_joint import estimated_label_issues

    class_0 = [0.9] * 4 + [0.5] * 4 + [0.1] * 2
    class_1 = [0.8] * 9 + [0.2]
    confidence = numpy.array(class_0 + class_1 + [float("nan"), 0.05])
    labels = numpy.array([0] * 10 + [1] * 10 + [1, -1])  # never scored; unlabelled: no part in it
    assert estimated_label_issues(confidence, labels) == {0: 3, 1: 1}
    assert estimated_label_issues(numpy.array([0.9, 0.1]), numpy.array([2, 2])) == {2: 0}  # one class: none


def _labelled_record(labels):
    table = _disagreeing_record()
    return table.add_column("label", labels)


def test_label_issues_returns_the_estimated_count_of_each_class_chosen_by_the_ranking():
    """With the record's labels the flagged set is the estimated count of each class, its likeliest rows by ``by``:
    the ranking changes the rows, not only their order."""
    import numpy

    from hf_selective_backprop.record.confident_joint import estimated_label_issues

    table = _labelled_record([0, 0, 0, 0, 0])
    quota = estimated_label_issues(numpy.asarray(table["confidence"], dtype=float), numpy.zeros(5, dtype=int))
    assert quota == {0: 0}  # one class: nothing is confidently another
    table = _labelled_record([0, 1, 0, 1, 1])  # class 0: rows 0, 2 (0.70, 0.40); class 1: rows 1, 3 (0.30, 0.85)
    # t0 = 0.55, t1 = 0.575: row 2 (1 - 0.40 >= 0.575) and row 1 (1 - 0.30 >= 0.55) are confidently the other class.
    for by, flagged in [("last_loss", [0, 3]), ("mean_loss", [1, 2]), ("confidence", [1, 2])]:
        issues = record.label_issues(table, by=by)
        assert issues["index"] == flagged, by
        assert issues["label_issue_rank"] == [0, 1]
    assert record.label_issues(table, top=3, by="last_loss")["index"] == [0, 2, 3]  # top=K: the ranking's first K


def _labelled_rows():
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": [[1 + i % 7, 2, 3] for i in range(32)], "attention_mask": [[1, 1, 1]] * 32,
                              "labels": [int(i % 3 == 0) for i in range(32)], "index": list(range(100, 132))})


def test_a_classifiers_record_keeps_each_examples_label_and_a_language_models_none(tmp_path):
    from datasets import Dataset
    from text_tiny import causal_lm, sequence_classifier

    rows = _labelled_rows()
    labels = rows["labels"]
    trainer = SelectiveBackpropTrainer(model=sequence_classifier(), train_dataset=rows,
                                       args=make_config(str(tmp_path / "classifier"), sb_strategy="none"))
    trainer.train()
    table = record.load_record(str(tmp_path / "classifier"))
    assert dict(zip(table["index"], table["label"], strict=True)) == dict(zip(range(100, 132), labels, strict=True))
    tokens = Dataset.from_dict({"input_ids": [[1, 2, 3, 4]] * 16, "attention_mask": [[1] * 4] * 16,
                                "labels": [[1, 2, 3, 4]] * 16})
    SelectiveBackpropTrainer(model=causal_lm(), train_dataset=tokens,
                             args=make_config(str(tmp_path / "lm"), sb_strategy="none")).train()
    assert "label" not in record.load_record(str(tmp_path / "lm")).column_names


def test_with_more_than_two_classes_the_likeliest_other_class_comes_from_the_margin():
    """Three classes; classes 1 and 2 have thresholds 0.575. Example 0 (label 0) has p(gold) 0.4, leaving 0.6 to the
    others. With an area under the margin of log 4 its likeliest other class holds 0.1 (0.4 / 4), under the
    thresholds: it is not confidently another class, where the rest of its probability (0.6) would have counted it.
    With a margin of -log 2 the likeliest other holds 0.6 (0.8, capped at 1 - p(gold)) and it counts. Classes 1 and
    2's examples at 0.25 lean to no other class (margin 3): confidently none, where 1 - 0.25 would count them."""
    import math

    import numpy
    from datasets import Dataset

    from hf_selective_backprop.record.confident_joint import estimated_label_issues

    others = [0.9, 0.9, 0.25, 0.25]
    rows = {"index": list(range(13)), "label": [0] * 5 + [1] * 4 + [2] * 4,
            "confidence": [0.4] + [0.9] * 4 + others + others,
            "variability": [0.0] * 13, "last_loss": [1.0] + [0.1] * 12}
    spread = Dataset.from_dict({**rows, "aum": [math.log(4)] + [3.0] * 12})
    assert len(record.label_issues(spread)) == 0
    leaning = Dataset.from_dict({**rows, "aum": [-math.log(2)] + [3.0] * 12})
    assert record.label_issues(leaning)["index"] == [0]
    without_margins = estimated_label_issues(numpy.array(rows["confidence"]), numpy.array(rows["label"]))
    assert without_margins == {0: 1, 1: 2, 2: 2}


def test_labels_that_cannot_be_read_leave_the_record_written_without_them(tmp_path, monkeypatch, caplog):
    import logging

    from text_tiny import sequence_classifier

    from hf_selective_backprop.record import keeper

    def unreadable(dataset, id_column):
        raise RuntimeError("a label column that cannot be read")

    monkeypatch.setattr(keeper, "class_labels", unreadable)
    args = make_config(str(tmp_path), sb_strategy="none")
    with caplog.at_level(logging.WARNING):
        SelectiveBackpropTrainer(model=sequence_classifier(), args=args, train_dataset=_labelled_rows()).train()
    table = record.load_record(str(tmp_path))
    assert len(table) == 32 and "label" not in table.column_names
    assert "written without its examples' class labels" in caplog.text


def test_class_labels_are_read_only_where_each_example_has_one_integer():
    from datasets import Dataset

    from hf_selective_backprop.record.labels import class_labels

    ids, labels = class_labels(Dataset.from_dict({"index": [5, 6, 7], "labels": [2, 0, 1]}), "index")
    assert ids.tolist() == [5, 6, 7] and labels.tolist() == [2, 0, 1]
    for rows in ({"labels": [[1, 0], [0, 1], [1, 1]]}, {"labels": [True, False, True]}, {"labels": [0.5, 1.0, 2.0]},
                 {"labels": [[1, 2], [3], [4, 5, 6]]}, {"text": ["a", "b", "c"]}):
        assert class_labels(Dataset.from_dict({"index": [5, 6, 7], **rows}), "index") is None, rows
