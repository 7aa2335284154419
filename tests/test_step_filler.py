"""`StepFiller`: selection batches read, the rows each trains queued (all, the planned ones, the ones a stream's
rule decides, or the ones the strategy selects), and popped as whole micro-batches."""

import pytest
import torch
from engine_parts import parts, rows
from tiny import make_config

from hf_selective_backprop.engine.batch_rows import WEIGHT_KEY
from hf_selective_backprop.engine.epoch_plan import EpochPlan


def _queued_ids(filler) -> list[int]:
    return filler.queue.pop(len(filler.queue))["index"].tolist() if len(filler.queue) else []


def test_rows_read_while_selection_is_off_are_all_queued_and_popped_as_whole_micro_batches(tmp_path):
    built = parts(make_config(str(tmp_path), gradient_accumulation_steps=2), batch_size=2)
    filler = built.filler
    filler.add_batch(rows([0, 1, 2]), selecting=False, model=None)
    assert not filler.ready() and built.scorer.scored == []  # no forward while selection is off
    filler.add_batch(rows([3, 4]), selecting=False, model=None)
    assert filler.ready()
    micro_batches = filler.next_step("cpu")
    assert [batch["index"].tolist() for batch in micro_batches] == [[0, 1], [2, 3]]
    assert _queued_ids(filler) == [4]  # carried over to the next step
    stats = built.stats
    assert (stats.examples_loaded, stats.examples_seen, stats.training_forwards, stats.optimizer_steps) == (5, 5, 4, 1)


def test_a_selecting_batch_is_scored_and_the_strategy_keeps_its_highest_losses(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="topk", sb_keep=0.5))
    built.filler.add_batch(rows([0, 1, 2, 3], losses=[0.3, 2.0, 0.1, 1.0]), selecting=True, model=None)
    assert built.scorer.scored == [[0, 1, 2, 3]]
    assert _queued_ids(built.filler) == [1, 3]
    assert (built.stats.considered, built.stats.kept, built.stats.selection_forwards) == (4, 2, 4)


def test_a_non_finite_loss_is_never_kept_and_is_counted_for_the_epochs_check(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="topk", sb_keep=0.5))
    built.filler.add_batch(rows([0, 1, 2, 3], losses=[float("nan"), 2.0, 0.1, float("inf")]), True, None)
    kept = _queued_ids(built.filler)
    assert kept and 0 not in kept and 3 not in kept
    assert built.stats.nonfinite_losses == 2
    assert (built.nonfinite.epoch_scored, built.nonfinite.epoch_nonfinite) == (4, 2)


def test_a_planned_epochs_decided_rows_are_queued_with_their_weights_without_a_forward(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="infobatch"))
    copies = torch.tensor([1, 0, 1, 1, 0, 0], dtype=torch.int32)
    weights = torch.tensor([2.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    built.planner.epoch_plan = EpochPlan(copies, torch.zeros(6, dtype=torch.bool), weights)
    built.filler.add_batch(rows([3, 0, 2]), selecting=True, model=None)
    queued = built.filler.queue.pop(len(built.filler.queue))
    assert queued["index"].tolist() == [3, 0, 2] and queued[WEIGHT_KEY].tolist() == [2.0, 2.0, 1.0]
    assert built.scorer.scored == [] and built.stats.examples_seen == 0  # counted when the plan was made


def test_a_planned_batch_scores_only_its_undecided_rows(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="topk", sb_keep=1.0))
    copies = torch.tensor([1, 0, 0, 1], dtype=torch.int32)
    built.planner.epoch_plan = EpochPlan(copies, copies == 0)
    built.filler.add_batch(rows([0, 1, 2, 3]), selecting=True, model=None)
    assert built.scorer.scored == [[1, 2]]
    assert sorted(_queued_ids(built.filler)) == [0, 1, 2, 3]


def test_a_streams_batch_is_decided_from_its_stored_losses_by_the_epochs_rule(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="infobatch", sb_prune_ratio=0.99))
    built.losses.store.update(torch.arange(4), torch.tensor([0.1, 5.0, 0.2, 6.0]), epoch=0)
    built.planner.stream_rule = 3.0  # the epoch's mean: rows below it are pruned (all but 1 in 100)
    built.filler.add_batch(rows([0, 1, 2, 3]), selecting=True, model=None)
    queued = built.filler.queue.pop(len(built.filler.queue))
    assert {1, 3} <= set(queued["index"].tolist()) and built.scorer.scored == []
    assert built.stats.considered == 4 and built.stats.kept == len(queued["index"])
    assert torch.all(queued[WEIGHT_KEY] >= 1.0)


def test_a_weighting_strategys_rows_carry_weights_even_when_nothing_weighed_them(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="infobatch"))
    built.filler.add_batch(rows([5, 6]), selecting=False, model=None)
    assert built.filler.queue.pop(2)[WEIGHT_KEY].tolist() == [1.0, 1.0]


def test_reads_skip_what_the_planner_says_and_the_first_batch_checks_its_rows(tmp_path):
    built = parts(make_config(str(tmp_path)))
    built.planner.unread_skips = 2  # a resumed stream's batches read before the checkpoint
    batches = iter([rows([0]), rows([1]), rows([2])])
    assert built.filler.read(batches)["index"].tolist() == [2] and built.filler.read(batches) is None
    assert built.planner.unread_skips == 0
    with pytest.raises(ValueError, match="not one row per example"):
        built.filler.check_inputs({**rows([0, 1]), "packed": torch.zeros(3)}, model=None)
    built.filler.check_inputs(rows([0, 1]), model=None)
    assert built.filler.inputs_checked and built.scorer.scored[-1] == [0]  # one example through the forward


def test_the_state_holds_the_queue_and_a_resumed_rank_takes_over_the_rows_of_the_ranks_it_continues(tmp_path):
    config = make_config(str(tmp_path))
    first, second = parts(config).filler, parts(config).filler
    first.add_batch(rows([0, 1]), selecting=False, model=None)
    second.add_batch(rows([2]), selecting=False, model=None)
    saved = {0: first.state_dict(), 1: second.state_dict()}
    assert set(saved[0]) == {"queue", "data"}
    resumed = parts(config).filler
    resumed.add_batch(rows([9]), selecting=False, model=None)  # dropped: the checkpoint's queue replaces it
    resumed.load_state_dict(saved, own=saved[0])
    assert _queued_ids(resumed) == [0, 1, 2]
