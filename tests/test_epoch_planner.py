"""`EpochPlanner`: an epoch's plan made before loading (by id, the same on every rank), stale epochs, a stream's
rule, the epoch's read position and where a resumed epoch starts."""

import sys

import pytest
import torch
from engine_parts import parts, sampler_over
from thread_ranks import run_ranks
from tiny import make_config

IDS = [12, 3, 7, 0, 9, 5, 14, 1]  # the dataset's ids by position, which are not its positions
STATE_KEYS = {"epoch", "consumed", "rows_per_batch", "epoch_started", "plan", "stream_rule", "world_size"}


def _planned(config, epoch=0, selection_batch_size=4):
    built = parts(config, selection_batch_size=selection_batch_size)
    built.planner.sampler = sampler_over(IDS)
    built.planner.begin(epoch, 2, True, built.losses)
    return built


def _trained_positions(plan) -> list[int]:
    return [position for position, example in enumerate(IDS) if plan.copies[example] > 0]


def test_stale_epochs_are_those_between_every_staleness_th_epoch_after_the_warm_up(tmp_path):
    planner = parts(make_config(str(tmp_path), sb_staleness=3, sb_warmup_epochs=1)).planner
    assert [planner.is_stale_epoch(epoch) for epoch in range(1, 8)] == [False, True, True, False, True, True, False]
    fresh = parts(make_config(str(tmp_path))).planner
    assert not any(fresh.is_stale_epoch(epoch) for epoch in range(5))


def test_a_planned_epoch_decides_its_rows_by_id_and_the_sampler_loads_only_those(tmp_path):
    config = make_config(str(tmp_path), sb_strategy="uniform", sb_keep=0.5)
    built = _planned(config)
    plan = built.planner.epoch_plan
    trained = plan.copies.nonzero().squeeze(1).tolist()
    assert len(plan.copies) == max(IDS) + 1 and len(trained) == 4 and set(trained) <= set(IDS)
    assert not bool(plan.scored.any())
    assert built.planner.sampler.epoch_plan is plan and built.planner.sampler.skip == 0
    assert list(built.planner.sampler) == _trained_positions(plan)
    # Every example was decided before loading: seen and considered, loaded or not.
    assert (built.stats.examples_seen, built.stats.considered, built.stats.kept) == (8, 8, 4)
    # Seeded by the epoch alone: a re-launched run draws the same plan.
    assert torch.equal(_planned(config).planner.epoch_plan.copies, plan.copies)


def test_a_stale_epoch_is_planned_from_the_stored_losses_and_scores_only_the_unknown_ids(tmp_path):
    built = parts(make_config(str(tmp_path), sb_staleness=2, sb_strategy="topk", sb_keep=0.5))
    known = torch.tensor([example for example in IDS if example != 14])
    built.losses.store.update(known, known / 10, epoch=0)
    built.planner.sampler = sampler_over(IDS)
    built.planner.begin(1, 2, True, built.losses)
    plan = built.planner.epoch_plan
    assert plan.scored.nonzero().squeeze(1).tolist() == [14] and int(plan.copies[14]) == 0
    assert built.stats.stale_lookups == len(known)
    assert 0 < int(plan.copies.sum()) == built.stats.kept < len(known)


def test_an_epoch_is_planned_only_where_every_step_of_it_selects(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="uniform", sb_keep=0.5, sb_start=0.5))
    planner = built.planner
    planner.sampler = sampler_over(IDS)
    planner.begin(1, 4, True, built.losses)  # a quarter to a half of the run: before the window opens
    assert planner.epoch_plan is None and list(planner.sampler) == list(range(len(IDS)))
    planner.begin(2, 4, True, built.losses)
    assert planner.epoch_plan is not None
    planner.begin(3, 4, False, built.losses)  # a step-based run: which share of it an epoch is, is unknown
    assert planner.epoch_plan is None


def test_the_main_process_plans_alone_and_every_rank_follows_its_plan(tmp_path):
    config = make_config(str(tmp_path), sb_strategy="uniform", sb_keep=0.5)

    def on_each_rank(accelerator):
        built = parts(config, accelerator)
        built.planner.sampler = sampler_over(IDS)
        built.planner.begin(0, 2, True, built.losses)
        return built.planner.epoch_plan.copies, built.stats.kept

    world, results, errors = run_ranks(on_each_rank)
    assert errors == [None, None], errors
    assert torch.equal(results[0][0], results[1][0]) and int(results[0][0].sum()) == 4
    assert [kept for _, kept in results] == [4, 0]  # counted once, where it was made
    assert [call[0] for call in world.calls[0]] == [call[0] for call in world.calls[1]] == ["broadcast_object_list"]


def test_a_streams_epoch_gets_the_strategys_rule_from_the_store_instead_of_a_plan(tmp_path):
    built = parts(make_config(str(tmp_path), sb_strategy="infobatch"))
    built.losses.store.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 6.0]), epoch=0)
    built.planner.begin(1, 2, True, built.losses)  # no sampler: a stream
    assert built.planner.epoch_plan is None and built.planner.stream_rule == pytest.approx(3.0)
    assert built.planner.batches_in_epoch == sys.maxsize  # an epoch of unknown length


def test_a_resumed_epoch_keeps_its_plan_and_its_sampler_skips_the_rows_read(tmp_path):
    config = make_config(str(tmp_path), sb_strategy="uniform", sb_keep=0.5)
    before = _planned(config, epoch=1, selection_batch_size=2).planner
    before.batches_read = 1  # one selection batch of 2 rows read before the checkpoint
    state = before.state_dict()
    assert set(state) == STATE_KEYS and state["consumed"] == 1 and state["epoch_started"]

    resumed = parts(config, selection_batch_size=2).planner
    resumed.sampler = sampler_over(IDS)
    resumed.load_state_dict(state)
    resumed.begin(1, 2, True, parts(config).losses)  # another store: the saved plan is not redrawn
    assert torch.equal(resumed.epoch_plan.copies, before.epoch_plan.copies)
    assert (resumed.sampler.skip, resumed.batches_read) == (2, 1)
    assert list(resumed.sampler) == _trained_positions(before.epoch_plan)[2:]
    # The loader's first read would draw a seed the uninterrupted run drew before its checkpoint.
    assert resumed.next_read() == (0, True) and resumed.next_read() == (0, False)

    again = parts(config, selection_batch_size=2).planner
    again.sampler = sampler_over(IDS)
    again.load_state_dict(state, ignore_data_skip=True)
    again.begin(1, 2, True, parts(config).losses)
    assert (again.sampler.skip, again.batches_read, again.next_read()) == (0, 0, (0, False))


def test_a_resumed_stream_reads_its_consumed_batches_again_on_another_number_of_processes(tmp_path):
    planner = parts(make_config(str(tmp_path)), selection_batch_size=2).planner
    built = parts(make_config(str(tmp_path)))
    planner.load_state_dict({"epoch": 0, "consumed": 3, "rows_per_batch": 2, "epoch_started": True, "plan": None,
                             "stream_rule": 0.5, "world_size": 2})
    planner.begin(0, 1, True, built.losses)
    assert planner.stream_rule == 0.5  # the saved rule, not one made from the store of now
    assert planner.batches_read == 6 and planner.next_read() == (6, True) and planner.next_read() == (0, False)


def test_an_epoch_ends_counting_whether_it_took_a_step_and_reads_as_a_share_of_the_epoch(tmp_path):
    built = _planned(make_config(str(tmp_path), sb_strategy="uniform", sb_keep=0.5))
    planner = built.planner
    planner.dataloader = [None] * 4
    planner.begin(0, 2, True, built.losses)
    planner.batches_read = 2
    assert planner.epochs_read() == pytest.approx(0.5)
    planner.end()
    assert (planner.epoch, planner.epoch_plan, planner.batches_read, planner.epoch_started) == (1, None, 0, False)
    assert planner.epoch_without_step
    planner.steps_in_epoch = 3
    planner.end()
    assert not planner.epoch_without_step and planner.steps_in_epoch == 0 and planner.epoch == 2
