"""Fault injection: a table of bad inputs, each with the error it must give, and a table of faults, each
with the invariants it must keep (docs/benchmarks/reliability.md lists both).

Bad inputs fail with a ValueError that names the flag, or the column and row, before the first step.
Faults (a kill at a checkpoint or during a save, an interrupt during a selection batch, a full disk)
leave no partial checkpoint that passes for complete, delete nothing but the run's own checkpoints,
and a resume from the last complete checkpoint ends with the uninterrupted run's weights.
The subprocess SIGKILL at random points is `test_resume.py::test_sigkill_then_resume_reaches_the_uninterrupted_run`.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

import datasets
import pyarrow.parquet
import pytest
import safetensors.torch
import torch
from test_faults import dataset, tensors
from test_text_data import run_script
from tiny import TinyClassifier, TinyConv, augmentation, make_config, make_dataset, make_images
from transformers import TrainerCallback, TrainerState

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.data import BatchTransform, DataArguments, ImageTensorDataset, load_image_data
from hf_selective_backprop.data.text import TextDataArguments, load_text_data
from hf_selective_backprop.engine.checkpoints import is_complete_checkpoint, last_complete_checkpoint
from hf_selective_backprop.engine.scoring import SelectionScorer


def trainer_for(output_dir, data=None, model=None, callbacks=(), **settings) -> SelectiveBackpropTrainer:
    settings = {"sb_strategy": "sb", "per_device_train_batch_size": 4, **settings}
    return SelectiveBackpropTrainer(model=model or TinyClassifier(), args=make_config(str(output_dir), **settings),
                                    train_dataset=data if data is not None else make_dataset(64),
                                    callbacks=list(callbacks))


def images(n: int = 48, augment: bool = True, index_column: str = "index") -> ImageTensorDataset:
    pixels, labels = make_images(n)
    transform = augmentation(0) if augment else BatchTransform((0.5,), (0.25,))
    return ImageTensorDataset(pixels, labels, transform, torch.arange(n), index_column=index_column)


def drop_ids(rows: list[dict]) -> dict:
    """A collator of the user's that keeps only what the model takes."""
    return {key: torch.stack([row[key] for row in rows]) for key in ("pixel_values", "labels")}


def write_parquet(folder: Path, split: str, table: dict, features: datasets.Features) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    # Written by pyarrow, the schema carrying the features: datasets 4.8.4's own to_parquet divides by the row count
    # of a table with images, so it cannot write the empty split these tests need (nor can it read an empty row
    # group, so the rows go in as one, or none at all).
    arrow = datasets.Dataset.from_dict(table, features=features).data.table
    with pyarrow.parquet.ParquetWriter(str(folder / f"{split}.parquet"), arrow.schema) as writer:
        if arrow.num_rows:
            writer.write_table(arrow)
    return folder


def write_jsonl(folder: Path, split: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture(scope="module")
def augmented_checkpoints(tmp_path_factory):
    """checkpoint-2 of an augmented and of an unaugmented SB run (default settings: keep 1/3)."""
    saved = {}
    for augment in (True, False):
        output_dir = tmp_path_factory.mktemp(f"augment-{augment}")
        trainer_for(output_dir, images(augment=augment), TinyConv(), max_steps=2, save_strategy="steps",
                    save_steps=2).train()
        saved[augment] = str(output_dir / "checkpoint-2")
    return saved


# ---- bad inputs ------------------------------------------------------------------------------


def _dataset_ids_under_another_column(tmp_path, _):
    trainer_for(tmp_path, images(index_column="index"), TinyConv(), sb_index_column="foo", sb_staleness=2)


def _none_sentence(tmp_path, review_folder):
    rows = [{"review": "great acting" if i % 2 else "dull", "sentiment": "pos" if i % 2 else "neg"} for i in range(8)]
    rows[5]["review"] = None
    folder = write_jsonl(tmp_path / "texts", "train", rows)
    run_script(["--dataset", str(folder), "--label_column", "sentiment", "--eval_split", "none",
                    "--eval_strategy", "no", "--output_dir", str(tmp_path / "out"), "--use_cpu"])


def _empty_sentences(tmp_path, _):
    folder = write_jsonl(tmp_path / "texts", "train", [{"review": " ", "sentiment": s} for s in ("pos", "neg") * 4])
    load_text_data(TextDataArguments(dataset=str(folder), label_column="sentiment", eval_split="none"))


def _history_size_1e12(tmp_path, _):
    make_config(str(tmp_path), sb_history_size=10**12)


def _empty_image_parquet(tmp_path, _):
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    folder = write_parquet(tmp_path / "images", "train", {"img": [], "label": []}, features)
    load_image_data(DataArguments(dataset=str(folder), eval_split="none"))


def _empty_text_parquet(tmp_path, _):
    features = datasets.Features({"review": datasets.Value("string"), "sentiment": datasets.Value("string")})
    folder = write_parquet(tmp_path / "texts", "train", {"review": [], "sentiment": []}, features)
    load_text_data(TextDataArguments(dataset=str(folder), label_column="sentiment", eval_split="none"))


def _image_paths_without_image_feature(image_column):
    def load(tmp_path, _):
        features = datasets.Features({"path": datasets.Value("string"), "label": datasets.ClassLabel(names=["a"])})
        folder = write_parquet(tmp_path / "paths", "train", {"path": ["a.png"], "label": [0]}, features)
        load_image_data(DataArguments(dataset=str(folder), eval_split="none", image_column=image_column))

    return load


def _kath18_presample_too_large(tmp_path, _):
    trainer_for(tmp_path, make_dataset(48), sb_strategy="kath18", sb_presample=8.0,
                per_device_train_batch_size=8).train()


def _resume_with_augmentation_turned(augment: bool):
    def resume(tmp_path, checkpoints):
        trainer = trainer_for(tmp_path, images(augment=augment), TinyConv(), max_steps=4)
        trainer.train(resume_from_checkpoint=checkpoints[not augment])

    return resume


def _out_of_range_label(tmp_path, _):  # from test_faults.py
    x, y = tensors(64)
    y[5] = 7
    trainer_for(tmp_path, dataset(x, y)).train()


def _duplicate_ids(tmp_path, _):  # from test_faults.py
    x, y = tensors(64)
    trainer_for(tmp_path, dataset(x, y, index=[0, 1, 2, 3] * 16), sb_staleness=2).train()


NO_IMAGES = r"no column of the dataset holds images \(a datasets.Image feature\); cast the column"
BAD_INPUTS = {
    "index_column_of_the_dataset_differs": (_dataset_ids_under_another_column, r"^--sb_index_column 'foo': the "
                                            r"training dataset gives its ids under 'index'; pass --sb_index_column "
                                            r"index"),
    # Used to be a TypeError inside train_wordpiece_tokenizer.
    "none_sentence": (_none_sentence, r"^--train_split 'train', text column 'review': no text \(None\) at row 5; "
                      r"fix or drop that row"),
    # Used to train on special tokens alone.
    "empty_sentences": (_empty_sentences, r"^--train_split 'train', text column 'review': every text is empty"),
    # Used to fail in the allocator.
    "history_size_1e12": (_history_size_1e12, r"^--sb_history_size must be at most 100,000,000 \(.*4,000 GB\), got "
                          r"1000000000000"),
    # Used to say the label column "holds no class id >= 0; pass --label_column".
    "empty_image_parquet": (_empty_image_parquet, r"^'.*images': its 'train' split is empty \(0 rows\)"),
    "empty_text_parquet": (_empty_text_parquet, r"^'.*texts': its 'train' split is empty \(0 rows\)"),
    # Both used to end in "pass --image_column", whatever column was passed.
    "no_image_column": (_image_paths_without_image_feature(None), rf"^no image column found; .*; {NO_IMAGES}"),
    "image_column_without_images": (_image_paths_without_image_feature("path"),
                                    rf"^--image_column 'path' does not hold images \(.*string.*\); .*; {NO_IMAGES}"),
    # Used to advise "a larger --sb_keep".
    "kath18_presample": (_kath18_presample_too_large, r"keeps about 6, fewer than one optimizer step needs .* or a "
                         r"smaller --sb_presample$"),
    # Both used to resume without a word.
    "resume_with_no_augment": (_resume_with_augmentation_turned(False), r"\n  --augment: saved True, now False\n"),
    "resume_with_augment": (_resume_with_augmentation_turned(True), r"\n  --augment: saved False, now True\n"),
    "out_of_range_label": (_out_of_range_label, r"'labels' column holds \[7\], outside the model's 3 classes"),
    "duplicate_ids": (_duplicate_ids, r"^--sb_index_column 'index' holds 60 duplicate ids"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_with_an_error_naming_what_to_change(case, tmp_path, review_folder, augmented_checkpoints):
    make_it_fail, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        make_it_fail(tmp_path, augmented_checkpoints if case.startswith("resume") else review_folder)


def test_a_collator_that_drops_the_id_column_gets_the_ids_back(tmp_path):
    # Used to load everything, then fail in the first step: AttributeError: 'NoneType' object has no attribute 'detach'.
    trainer = trainer_for(tmp_path, make_dataset(64), sb_index_column="foo", sb_staleness=2, num_train_epochs=2)
    trainer.data_collator = drop_ids
    trainer.train()
    assert trainer.sb_stats["stale_lookups"] == 64  # the stale epoch found every example's stored loss by its id
    assert torch.isfinite(trainer.engine.store.losses).all() and len(trainer.engine.store) == 64


def test_the_same_selection_settings_given_another_way_resume(augmented_checkpoints, tmp_path):
    # The checkpoint saved sb_beta=None (derived from the default keep 1/3): beta 2 is the same setting.
    for same in (dict(sb_beta=2.0), dict(sb_keep=1 / 3)):
        trainer = trainer_for(tmp_path, images(), TinyConv(), max_steps=3, **same)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train(resume_from_checkpoint=augmented_checkpoints[True])
        assert trainer.state.global_step == 3
        assert not [w for w in caught if "sb_" in str(w.message)]
    with pytest.raises(ValueError, match=r"\n  --sb_beta: saved 2.0, now 1.0\n"):
        trainer_for(tmp_path, images(), TinyConv(), max_steps=3, sb_beta=1.0).train(
            resume_from_checkpoint=augmented_checkpoints[True])


@pytest.mark.slow  # decodes images and builds a ResNet, as scripts/train.py does
def test_the_image_workflow_puts_its_ids_under_the_index_column_flag(tmp_path):
    from test_workflow import run_digits

    # Used to decode everything, then fail in the first step in the store.
    result, _ = run_digits(str(tmp_path / "run"), sb_index_column="foo", sb_staleness=2, image_size=8,
                           max_train_samples=64, eval_split="none", eval_strategy="no", num_train_epochs=2,
                           per_device_train_batch_size=8)
    assert result.stats["stale_lookups"] > 0


# ---- faults --------------------------------------------------------------------------------------


RUN = dict(sb_staleness=2, sb_selection_batch_size=6, num_train_epochs=3, save_strategy="steps", save_steps=2,
           save_total_limit=2)
FAULT_STEP = 6  # the fault strikes at or after this optimizer step


class Interrupted(KeyboardInterrupt):
    """What Ctrl-C (or a kill, for the files on disk) does at that point."""


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fail_during(monkeypatch, trainer, owner, name: str, error, nth_call_in_fault: int = 1):
    """Make ``owner.name`` raise ``error`` on its n-th call once the run reached FAULT_STEP."""
    real, calls = getattr(owner, name), []

    def faulty(*args, **kwargs):
        if trainer.state.global_step >= FAULT_STEP:
            calls.append(1)
            if len(calls) == nth_call_in_fault:
                error()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)


def interrupt():
    raise Interrupted()


class InterruptAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step >= FAULT_STEP:
            raise Interrupted()


FAULTS = {
    # What each fault leaves: does the save of FAULT_STEP exist half written (True), complete (False), or not at all?
    "kill_at_a_checkpoint": (lambda m, t: t.add_callback(InterruptAfterSave()), KeyboardInterrupt, False),
    # Everything but trainer_state.json written, as a kill between the files would leave it.
    "kill_during_a_save": (lambda m, t: fail_during(m, t, TrainerState, "save_to_json", interrupt), KeyboardInterrupt,
                           True),
    "interrupt_during_a_selection_batch": (
        lambda m, t: fail_during(m, t, SelectionScorer, "__call__", interrupt, nth_call_in_fault=2), KeyboardInterrupt,
        None),
    "disk_full_writing_the_weights": (lambda m, t: fail_during(m, t, safetensors.torch, "save_file", disk_full),
                                      OSError, True),
    # torch.save writes sb_state.pt, sb_rank_state_0.pt, then the optimizer: the third call fails.
    "disk_full_writing_the_optimizer": (
        lambda m, t: fail_during(m, t, torch, "save", disk_full, nth_call_in_fault=3), OSError, True),
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    trainer = trainer_for(tmp_path_factory.mktemp("uninterrupted"), **RUN)
    trainer.train()
    return trainer


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_leaves_no_partial_checkpoint_as_complete_and_the_run_resumes_exactly(
    fault, uninterrupted, tmp_path, monkeypatch
):
    inject, raised, leaves_torn = FAULTS[fault]
    out = tmp_path / "run"
    user_folder = out / "checkpoint-5"
    user_folder.mkdir(parents=True)
    (user_folder / "notes.txt").write_text("the user's")
    victim = trainer_for(out, **RUN)
    inject(monkeypatch, victim)
    with pytest.raises(raised):
        victim.train()
    monkeypatch.undo()
    stopped_at = victim.state.global_step
    torn = out / f"checkpoint-{stopped_at}"

    # No partial checkpoint passes for complete; the last complete one is the previous save.
    if leaves_torn:
        assert torn.is_dir() and not is_complete_checkpoint(str(torn))
        assert last_complete_checkpoint(str(out)) == str(out / f"checkpoint-{stopped_at - RUN['save_steps']}")
    elif leaves_torn is False:
        assert last_complete_checkpoint(str(out)) == str(torn)
    for folder in out.glob("checkpoint-*"):
        assert is_complete_checkpoint(str(folder)) or folder in (torn, user_folder), folder
    # Nothing outside the run's own checkpoints deleted.
    assert (user_folder / "notes.txt").read_text() == "the user's"

    resumed = trainer_for(out, **RUN)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == uninterrupted.state.global_step
    for name, weight in uninterrupted.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], weight), name
    assert resumed.sb_stats["backwards"] == uninterrupted.sb_stats["backwards"]
    assert (user_folder / "notes.txt").read_text() == "the user's"
    own = [f for f in out.glob("checkpoint-*") if f != user_folder and is_complete_checkpoint(str(f))]
    assert len(own) <= RUN["save_total_limit"]
