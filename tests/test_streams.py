"""Streams (`load_dataset(..., streaming=True)`) with an id column under Stale-SB, InfoBatch and RHO-LOSS.

A local parquet file of 48 rows (`tiny.make_dataset`, with its ``index`` column) read as a stream, or
the rows as a shuffled stream: a step-based run reads it several times (each pass one epoch). The two-process run is in
`tests/test_distributed.py`-style: see ``test_two_processes_stream_their_shares_in_lockstep``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from datasets import load_dataset
from launch import launch, resumes_cpu_processes
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.checkpoints import STATE_FILE
from hf_selective_backprop.engine.indexing import MIN_ID_SPAN
from hf_selective_backprop.engine.store import LossStore
from hf_selective_backprop.engine.streams import check_id_bound
from hf_selective_backprop.trainer import WEIGHT_KEY

ROWS = 48
ROOT = Path(__file__).resolve().parents[1]


def write_parquet(folder: Path, with_index: bool = True, rows: int = ROWS) -> str:
    path = folder / ("rows.parquet" if with_index else "rows_without_ids.parquet")
    data = make_dataset(rows, with_index=with_index).with_format(None)
    data.to_parquet(str(path))
    return str(path)


def stream(path: str):
    return load_dataset("parquet", data_files=path, split="train", streaming=True)


def shuffled_stream(rows: int = ROWS):
    """A stream reshuffled every pass (its shards' order and a buffer, seeded by the pass). A shuffled parquet
    stream would do too, but `datasets` sleeps 5 s at the end of each of its passes (a workaround for an Arrow
    issue, ``datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN``)."""
    data = make_dataset(rows, with_index=True).with_format(None).to_iterable_dataset(num_shards=4)
    return data.shuffle(seed=3, buffer_size=16)


class Recording(SelectiveBackpropTrainer):
    """Records the ids and weights of every trained micro-batch."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained = getattr(self, "trained", [])
        self.trained.append((inputs.get("index"), inputs.get(WEIGHT_KEY)))
        return super().training_step(model, inputs, num_items_in_batch)


def train(output_dir, data, resume=None, model_seed=0, **overrides):
    settings = dict(max_steps=24, per_device_train_batch_size=4, sb_selection_batch_size=8, sb_strategy="sb")
    settings.update(overrides)
    trainer = Recording(model=TinyClassifier(seed=model_seed), train_dataset=data,
                        args=make_config(output_dir, **settings))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_stale_sb_on_a_stream_reads_it_and_looks_stored_losses_up(tmp_path):
    trainer = train(str(tmp_path / "out"), stream(write_parquet(tmp_path)), sb_staleness=2)
    stats = trainer.sb_stats
    # Pass 0 scores every row; the stale passes look their rows up instead of scoring them.
    assert stats["stale_lookups"] > ROWS / 2
    assert stats["selection_forwards"] + stats["stale_lookups"] == stats["examples_seen"]
    assert stats["examples_loaded"] == stats["examples_seen"]  # a stream is read in full: nothing is unloaded
    store = trainer.engine.store
    assert len(store) == ROWS and bool(torch.isfinite(store.losses).all())  # grown as the ids arrived
    assert trainer.state.global_step == 24


def test_infobatch_on_a_stream_prunes_each_batch_by_its_stored_losses(tmp_path):
    trainer = train(str(tmp_path / "out"), stream(write_parquet(tmp_path)), sb_strategy="infobatch",
                    sb_prune_ratio=0.5, sb_anneal_delta=0.75)
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 0
    assert stats["kept"] < stats["considered"]  # easy rows pruned from the second pass on
    weights = torch.cat([weights for _, weights in trainer.trained])
    assert set(weights.unique().tolist()) == {1.0, 2.0}  # 1/(1-r) on the kept easy rows
    # Annealed: the last quarter of the steps trains every row read, unweighted.
    assert set(torch.cat([w for _, w in trainer.trained[-4:]]).tolist()) == {1.0}


def test_rholoss_on_a_stream_scores_one_pass_with_the_reference(tmp_path):
    reference = TinyClassifier(seed=5)
    trainer = Recording(model=TinyClassifier(), train_dataset=stream(write_parquet(tmp_path)),
                        reference_model=reference,
                        args=make_config(str(tmp_path / "out"), max_steps=12, per_device_train_batch_size=4,
                                         sb_selection_batch_size=8, sb_strategy="rholoss"))
    trainer.train()
    assert trainer.sb_stats["reference_forwards"] == ROWS  # one pass of the stream
    table = trainer.engine.irreducible.losses
    assert table.numel() == ROWS and bool(torch.isfinite(table).all())
    ids = torch.arange(ROWS)
    rows = make_dataset(ROWS)[:]
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(reference(rows["pixel_values"])["logits"], rows["labels"],
                                                     reduction="none")
    torch.testing.assert_close(table[ids], expected)
    assert trainer.sb_stats["kept"] < trainer.sb_stats["considered"]


def test_rholoss_on_a_stream_takes_a_reference_column(tmp_path):
    data = make_dataset(ROWS, with_index=True).with_format(None)
    data = data.add_column("irreducible", [float(i % 7) / 4 for i in range(ROWS)])
    path = str(tmp_path / "with_column.parquet")
    data.to_parquet(path)
    trainer = train(str(tmp_path / "out"), stream(path), max_steps=8, sb_strategy="rholoss",
                    sb_reference_column="irreducible")
    torch.testing.assert_close(trainer.engine.irreducible.losses, torch.tensor([float(i % 7) / 4 for i in
                                                                                 range(ROWS)]))


@pytest.mark.parametrize("strategy", ["stale_sb", "infobatch"])
def test_a_resume_mid_stream_reaches_the_uninterrupted_run(strategy, tmp_path):
    settings = dict(sb_staleness=2) if strategy == "stale_sb" else dict(sb_strategy="infobatch", sb_anneal_delta=0.9)
    full = train(str(tmp_path / "full"), shuffled_stream(), **settings)
    partial = str(tmp_path / "partial")
    train(partial, shuffled_stream(), save_strategy="steps", save_steps=5, **settings)
    states = {}
    for name in os.listdir(partial):
        if name.startswith("checkpoint"):
            states[name] = torch.load(os.path.join(partial, name, STATE_FILE), weights_only=True)
    # Inside a pass (its read batches to skip) that decides from the store: a stale epoch, or InfoBatch's rule.
    inside = [name for name, state in states.items() if state["consumed"] > 0 and state["epoch"] % 2 == 1
              and (strategy == "stale_sb" or state["stream_rule"] is not None)]
    assert inside, f"no checkpoint inside a deciding pass: {[(s['epoch'], s['consumed']) for s in states.values()]}"
    resumed = train(str(tmp_path / "resumed"), shuffled_stream(), resume=os.path.join(partial, sorted(inside)[0]),
                    **settings)
    assert resumed.state.global_step == full.state.global_step
    for ours, theirs in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    for counter in ("kept", "considered", "stale_lookups", "selection_forwards", "examples_loaded"):
        assert resumed.sb_stats[counter] == full.sb_stats[counter], counter
    torch.testing.assert_close(resumed.engine.store.losses, full.engine.store.losses, rtol=0, atol=0)


@pytest.mark.parametrize("strategy", ["stale_sb", "infobatch", "rholoss"])
def test_a_stream_without_ids_is_refused_at_construction_naming_the_column(strategy, tmp_path):
    settings = dict(sb_staleness=2) if strategy == "stale_sb" else dict(sb_strategy=strategy)
    if strategy == "rholoss":
        settings["sb_reference_column"] = "labels"
    with pytest.raises(ValueError, match=r"--sb_index_column 'index' is not in the training stream's columns, which "
                                         r"hold pixel_values, labels: --sb_.* looks examples up by it"):
        train(str(tmp_path / "out"), stream(write_parquet(tmp_path, with_index=False)), **settings)


def test_a_stream_of_unknown_columns_without_ids_fails_at_its_first_batch(tmp_path):
    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            data = make_dataset(ROWS)
            yield from (data[i] for i in range(ROWS))

    with pytest.raises(ValueError, match=r"--sb_index_column 'index' is not in the training batches, which hold "
                                         r"pixel_values, labels: --sb_staleness 2 looks examples up by it"):
        train(str(tmp_path / "out"), Rows(), sb_staleness=2)


@pytest.mark.parametrize("strategy", ["sb", "uniform"])
def test_strategies_without_stored_losses_need_no_ids_on_a_stream(strategy, tmp_path):
    trainer = train(str(tmp_path / "out"), stream(write_parquet(tmp_path, with_index=False)), max_steps=4,
                    sb_strategy=strategy)
    assert trainer.state.global_step == 4


def test_map_style_infobatch_trains_max_steps_as_the_trainer_does(tmp_path):
    trainer = train(str(tmp_path / "out"), make_dataset(ROWS), sb_strategy="infobatch", max_steps=5)
    assert trainer.state.global_step == 5


def _launch_stream_worker(tmp_path: Path, path: str, mode: str) -> list[dict]:
    out = tmp_path / mode
    out.mkdir()
    return launch(out, ["--data", path, "--mode", mode], worker=ROOT / "tests" / "stream_worker.py")


@resumes_cpu_processes
@pytest.mark.slow
def test_two_processes_stream_their_shares_in_lockstep(tmp_path):
    """torchrun, 2 CPU processes over gloo: each rank streams its share (split_dataset_by_node) under Stale-SB;
    the ranks stay in lockstep and end with the same weights, and a run resumed inside a stale pass ends with
    the uninterrupted run's weights."""
    path = write_parquet(tmp_path, rows=64)
    results = {mode: _launch_stream_worker(tmp_path, path, mode) for mode in ("first", "resume")}
    first = results["first"]
    for ours, theirs in zip(first[0]["params"], first[1]["params"], strict=True):
        assert torch.equal(ours, theirs)  # same weights on both ranks
    for result in first + results["resume"]:  # the same collectives on both ranks, every tensor on the device
        assert result["collectives"]["first_difference"] is None and result["collectives"]["misplaced"] == []
    assert first[0]["step"] == first[1]["step"] == 16
    assert first[0]["stats"]["stale_lookups"] > 0
    assert first[0]["store"].numel() == 64 and bool(torch.isfinite(first[0]["store"]).all())
    torch.testing.assert_close(first[0]["store"], first[1]["store"], rtol=0, atol=0)  # one store, every id
    assert set(first[0]["ids"]).isdisjoint(first[1]["ids"])  # each rank trained rows of its own share only
    resumed = results["resume"]
    for rank in range(2):
        for ours, theirs in zip(resumed[rank]["params"], first[rank]["params"], strict=True):
            assert torch.equal(ours, theirs)  # the resumed run is the uninterrupted one
        torch.testing.assert_close(resumed[rank]["store"], first[rank]["store"], rtol=0, atol=0)


@pytest.mark.slow
def test_two_processes_stream_their_shares_under_infobatch_and_rholoss(tmp_path):
    """InfoBatch (each rank prunes its rows by the one store's mean) and RHO-LOSS (the reference scores each
    rank's share once, in lockstep, and both ranks hold every id's irreducible loss) on split streams."""
    ranks = _launch_stream_worker(tmp_path, write_parquet(tmp_path, rows=64), "strategies")
    report = ranks[0]["collectives"]  # the same collectives on both ranks, every tensor on the device
    assert report["first_difference"] is None and [r["collectives"]["misplaced"] for r in ranks] == [[], []]
    for name in ("infobatch", "rholoss"):
        for ours, theirs in zip(ranks[0][name]["params"], ranks[1][name]["params"], strict=True):
            assert torch.equal(ours, theirs), name
    infobatch = ranks[0]["infobatch"]
    assert infobatch["stats"]["kept"] < infobatch["stats"]["considered"]
    assert infobatch["weights"] | ranks[1]["infobatch"]["weights"] == {1.0, 2.0}
    rholoss = [rank["rholoss"] for rank in ranks]
    assert rholoss[0]["stats"]["reference_forwards"] == 64  # summed over ranks: each scored its share
    assert rholoss[0]["irreducible"].numel() == 64 and bool(torch.isfinite(rholoss[0]["irreducible"]).all())
    torch.testing.assert_close(rholoss[0]["irreducible"], rholoss[1]["irreducible"], rtol=0, atol=0)


def test_a_streams_store_grows_in_few_allocations_as_ids_arrive():
    store = LossStore()
    buffers = set()
    for start in range(0, 10_000, 8):  # ids in increasing order, as an unshuffled stream brings them
        store.update(torch.arange(start, start + 8), torch.ones(8), epoch=0)
        buffers.add(store.losses.untyped_storage().data_ptr())
        assert len(store) == start + 8 and store.losses.is_contiguous()
    assert len(buffers) < 30  # 1.5x growth: O(log N) reallocations, not one per batch
    assert store.losses.untyped_storage().nbytes() <= 1.5 * 4 * 10_000
    assert store.state_dict()["losses"].untyped_storage().nbytes() == 4 * 10_000  # saved at its size


def test_a_streams_id_far_beyond_the_rows_read_is_refused_naming_the_column():
    check_id_bound(torch.tensor([3, MIN_ID_SPAN - 1]), rows_read=8, column="row_id")
    with pytest.raises(ValueError, match=r"--sb_index_column 'row_id' holds 10000000000 after 8 rows of the stream: "
                                         r".* 111.8 GiB per process; renumber the ids densely"):
        check_id_bound(torch.tensor([3, 10**10]), rows_read=8, column="row_id")
