"""Collectives as NCCL needs them, checked on CPUs.

On GPUs Accelerate gathers with NCCL's ``all_gather_into_tensor``, which refuses host tensors and does not check
that every rank sent the same shape, and a rank that issues a collective the others do not waits forever (a rank
that raises alone leaves the others waiting until the timeout). gloo, on which the multi-process tests run,
forgives the first two. Two stand-ins check what gloo cannot:

- in this process, ranks as threads on the ``meta`` device (`thread_ranks`): the helpers of
  ``engine/distributed.py``, and the places where ranks hold different rows or fail alone;
- two processes under torchrun (gloo) training every strategy with each collective recorded (`collective_log`):
  the ranks' records must match call for call, shape for shape, every tensor on the accelerator's device.
"""

from __future__ import annotations

import pytest
import torch
from collective_worker import RUNS
from datasets import Dataset, load_dataset
from datasets.distributed import split_dataset_by_node
from launch import ROOT, launch
from thread_ranks import META, current, run_ranks
from tiny import FEATURES, TinyClassifier, make_config

from hf_selective_backprop import output_lock
from hf_selective_backprop.engine import SelectionEngine, distributed, streams
from hf_selective_backprop.engine.scoring import SelectionScorer
from hf_selective_backprop.engine.store import LossStore
from hf_selective_backprop.losses import cross_entropy_per_example
from hf_selective_backprop.selectors import Selection, Selector, build_selector

INT64, FLOAT64 = torch.int64, torch.float64


def _errors(errors: list) -> list[str]:
    return [f"{type(error).__name__}: {error}" for error in errors]


# ---- the helpers -----------------------------------------------------------------------------------


def test_the_helpers_hand_every_collective_tensors_on_the_device_of_one_shape():
    def on_each_rank(accelerator):
        rank = accelerator.process_index
        ids = torch.arange(3 * rank, 3 * rank + 1 + 2 * rank)  # rank 0: 1 row, rank 1: 3; ids on the host
        losses = (ids / 10).to(accelerator.device)
        return {
            "agreed": distributed.all_true(accelerator, True),
            "dissent": distributed.all_true(accelerator, rank == 0),
            "flags": distributed.flags_of_every_rank(accelerator, rank == 1),
            "pairs": distributed.gather_pairs(accelerator, ids, losses),
            "sums": distributed.sum_over_processes(accelerator, {"rows": len(ids), "ranks": 1}),
            "broadcast": distributed.broadcast_object(accelerator, {"from": rank}),
            "no failure": distributed.fail_together(accelerator, None),
        }

    world, results, errors = run_ranks(on_each_rank)
    assert errors == [None, None], _errors(errors)
    for rank, result in enumerate(results):
        assert result["agreed"] and not result["dissent"] and result["flags"] == [False, True]
        ids, losses, mine = result["pairs"]
        assert type(ids) is torch.Tensor and ids.tolist() == [0, 3, 4, 5]  # on the host, padding dropped
        assert torch.allclose(losses, ids / 10)
        assert ids[mine].tolist() == [[0], [3, 4, 5]][rank]
        assert result["sums"] == {"ranks": 2.0, "rows": 4.0}
        assert result["broadcast"] == {"from": 0}
    assert world.calls[0] == world.calls[1]
    assert [call for call in world.calls[0] if call[0] == "gather"] == [
        ("gather", (1,), INT64), ("gather", (1,), INT64), ("gather", (3, 2), FLOAT64)]  # padded to the longest


@pytest.mark.parametrize("collective, message", [
    (lambda a: distributed.gather(torch.ones(2)), "gather: a tensor on cpu, not on the accelerator's device meta"),
    (lambda a: distributed.gather(torch.ones(1 + a.process_index, device=a.device)), "the ranks' tensors differ"),
    (lambda a: distributed.all_true(a, True) if a.process_index else distributed.gather(torch.ones(1, device=a.device)),
     "the ranks called different collectives"),
])
def test_the_stand_in_fails_where_nccl_would(collective, message):
    _, _, errors = run_ranks(collective)
    assert any(message in text for text in _errors(errors)), _errors(errors)


def test_a_rank_that_failed_before_a_gather_stops_every_rank_naming_it():
    def on_each_rank(accelerator):
        failure = ValueError("the 'labels' column holds [7]") if accelerator.process_index == 1 else None
        distributed.gather_pairs(accelerator, torch.arange(2), torch.zeros(2, device=accelerator.device), failure)

    world, _, errors = run_ranks(on_each_rank)
    assert _errors(errors) == ["ValueError: stopped on every rank: rank 1 of 2: the 'labels' column holds [7]"] * 2
    assert world.calls[0] == world.calls[1] == [("gather", (1,), INT64), ("gather_object",)]  # the rows never sent


# ---- the engine: ranks that hold different rows ------------------------------------------------------


def _engine(accelerator, config, selector=None) -> SelectionEngine:
    engine = SelectionEngine(config, selector or build_selector(config), SelectionScorer(cross_entropy_per_example),
                             accelerator, batch_size=4, selection_batch_size=4)
    engine.store = LossStore(16)
    engine.store.update(torch.arange(8), torch.linspace(0.1, 0.8, 8), epoch=0)  # ids 8.. never scored
    return engine


def _batch(ids: list[int], device, labels: list[int] | None = None) -> dict:
    generator = torch.Generator().manual_seed(ids[0])
    rows = {"pixel_values": torch.randn(len(ids), FEATURES, generator=generator),
            "labels": torch.tensor(labels if labels is not None else [0] * len(ids)), "index": torch.tensor(ids)}
    return {key: value.to(device) for key, value in rows.items()}


def test_a_stale_lookup_batch_gathers_only_when_some_rank_scores(tmp_path):
    """A Stale-SB epoch that is not planned (a stream, --sb_interrupt) looks each batch's stored losses up: one
    all-reduce says whether any rank has rows to score, and only then do the ranks gather the store's rows."""
    config = make_config(str(tmp_path), sb_staleness=2, sb_history_scope="local")
    model = TinyClassifier()

    def on_each_rank(accelerator):
        rank = accelerator.process_index
        engine = _engine(accelerator, config)
        engine.epoch = 1  # a stale epoch, without a plan
        engine.add_batch(_batch([4 * rank + i for i in range(4)], META), True, model)  # every id stored
        engine.add_batch(_batch([8, 0, 1, 2] if rank == 0 else [3, 4, 5, 6], META), True, model)  # id 8: rank 0
        return engine.store.lookup(torch.tensor([8]))[0], engine.stats.selection_forwards

    world, results, errors = run_ranks(on_each_rank)
    assert errors == [None, None], _errors(errors)
    reduce = ("reduce", (1,), INT64)
    assert world.calls[0] == world.calls[1] == [reduce, reduce, ("gather", (1,), INT64), ("gather", (1, 2), FLOAT64)]
    assert [forwards for _, forwards in results] == [1, 0]
    assert torch.isfinite(results[0][0]).all() and torch.equal(results[0][0], results[1][0])  # one store


def test_a_class_label_out_of_range_on_one_rank_stops_every_rank(tmp_path):
    config = make_config(str(tmp_path))  # sb, the global history: each batch's losses are gathered
    model = TinyClassifier()

    def on_each_rank(accelerator):
        rank = accelerator.process_index
        engine = _engine(accelerator, config)
        ids = [4 * rank + i for i in range(4)]  # rank 1's bad row is its fourth, the example whose index is 7
        engine.add_batch(_batch(ids, META, labels=[0, 1, 2, 7 if rank == 1 else 0]), True, model)

    world, _, errors = run_ranks(on_each_rank)
    expected = ("ValueError: stopped on every rank: rank 1 of 2: the 'labels' column holds [7], outside the "
                "model's 3 classes")
    assert all(text.startswith(expected) for text in _errors(errors)), _errors(errors)
    # Named by its id, the same on every rank, not by its position in rank 1's share of the batch.
    assert all(text.endswith("or -100 to ignore a row (the example whose 'index' is 7)") for text in _errors(errors))


class PlansKnownRowsOnly(Selector):
    """Decides a stream's rows from their stored losses, and leaves a batch holding a row without one to scoring:
    None on a rank that read such a row, a selection on the others, which `Selector.plan_rows` must not do."""

    def plan_rows(self, stored_losses, generator, rule, progress):
        return None if bool(stored_losses.isnan().any()) else Selection(torch.arange(stored_losses.numel()))

    def _select(self, losses, generator, population):
        return Selection(torch.arange(losses.numel()))

    def expected_keep_fraction(self) -> float:
        return 1.0


def test_plan_rows_answering_none_on_some_ranks_only_is_refused_on_every_rank(tmp_path):
    config = make_config(str(tmp_path))
    model = TinyClassifier()

    def on_each_rank(accelerator):
        engine = _engine(accelerator, config, PlansKnownRowsOnly())
        engine.stream_rule = 0.5  # a stream's epoch whose rows the strategy decides from the store
        engine.add_batch(_batch([0, 1, 2, 3] if accelerator.process_index == 0 else [8, 9, 1, 2], META), True, model)

    _, _, errors = run_ranks(on_each_rank)
    expected = "ValueError: PlansKnownRowsOnly.plan_rows returned None (score these rows) on rank(s) [1] of 2"
    assert all(text.startswith(expected) for text in _errors(errors)), _errors(errors)
    assert "must return None on every rank or on none" in str(errors[0])


# ---- checks of one rank's data before a collective --------------------------------------------------


def _stream_shares(tmp_path, values) -> str:
    path = str(tmp_path / "rows.parquet")
    Dataset.from_dict({"index": list(range(len(values))), "irreducible": values}).to_parquet(path)
    return path


@pytest.mark.parametrize("missing", [False, True])
def test_a_reference_value_missing_from_one_ranks_share_stops_every_rank(tmp_path, missing):
    values = [0.5, None if missing else 1.5, 2.5, 3.5]  # split by row: row 1 is rank 1's
    path = _stream_shares(tmp_path, values)

    def on_each_rank(accelerator):
        stream = load_dataset("parquet", data_files=path, split="train", streaming=True)
        share = split_dataset_by_node(stream, rank=accelerator.process_index, world_size=2)
        return streams.column_pairs(share, "irreducible", "index", accelerator)

    _, results, errors = run_ranks(on_each_rank)
    if not missing:
        assert errors == [None, None], _errors(errors)
        for ids, losses in results:  # every rank holds every id's value
            assert sorted(ids.tolist()) == [0, 1, 2, 3] and torch.equal(losses[ids.argsort()], torch.tensor(values))
        return
    # Row 0 of rank 1's share: named by its id.
    expected = ("ValueError: stopped on every rank: rank 1 of 2: --sb_reference_column 'irreducible': no value for "
                "the row whose 'index' is 1")
    assert _errors(errors) == [expected] * 2


def test_an_output_dir_in_use_is_refused_on_every_rank(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    held = output_lock._claim(out)  # another run holds the folder
    monkeypatch.setattr(output_lock, "PartialState", current)
    entered = []

    def on_each_rank(accelerator):
        with output_lock.claimed(out):
            entered.append(accelerator.process_index)

    try:
        _, _, errors = run_ranks(on_each_rank)
    finally:
        output_lock._release(held)
    assert entered == []
    texts = _errors(errors)
    assert "is in use by another run" in texts[0] and texts[0] == texts[1], texts
    assert texts[0].startswith("ValueError: stopped on every rank: rank 0 of 2: --output_dir")


# ---- two processes: every strategy, each collective recorded -----------------------------------------


@pytest.fixture(scope="module")
def strategies(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    return launch(out, [], worker=ROOT / "tests" / "collective_worker.py")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_issues_the_same_collectives_with_tensors_on_the_device(strategies, name):
    ranks = [rank[name] for rank in strategies]
    report = ranks[0]["collectives"]
    assert report["first_difference"] is None, report["first_difference"]
    assert report["counts"][0] == report["counts"][1] > 0
    assert [rank["collectives"]["misplaced"] for rank in ranks] == [[], []]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert all(torch.equal(value, ranks[1]["weights"][key]) for key, value in ranks[0]["weights"].items())
    if name == "rholoss":  # 67 rows in batches of 8, even_batches=False: 5 reference batches on rank 0, 4 on rank 1
        assert ranks[0]["stats"]["reference_forwards"] == 67
