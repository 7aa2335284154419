"""`LossSource`: a batch's losses by a selection forward or from the store, the store every rank holds alike,
what the strategy ranks ('rholoss': reducible losses), the record's feed and the checkpoint state."""

import pytest
import torch
from engine_parts import parts, rows, sampler_over
from thread_ranks import META, run_ranks
from tiny import make_config

from hf_selective_backprop.engine.reference import IrreducibleLosses, ReferencePass
from hf_selective_backprop.losses import BadRowsError


class Record:
    """The run's example record, as the loss source feeds it."""

    def __init__(self):
        self.events = []

    def scored(self, ids, losses, margins, epoch):
        self.events.append((ids.tolist(), losses.tolist(), None if margins is None else margins.tolist(), epoch))


def test_what_the_strategy_ranks_is_the_loss_or_for_rholoss_the_reducible_loss(tmp_path):
    losses = torch.tensor([1.0, 1.0])
    plain = parts(make_config(str(tmp_path))).losses
    assert plain.ranked_losses(torch.tensor([2, 0]), losses) is losses
    built = parts(make_config(str(tmp_path), sb_strategy="rholoss", sb_keep=0.5))
    built.losses.use_irreducible(ReferencePass(IrreducibleLosses(torch.tensor([0.5, 1.0, 0.25])), forwards=3,
                                               seconds=0.1))
    assert (built.stats.reference_forwards, built.stats.reference_seconds) == (3, 0.1)
    assert torch.allclose(built.losses.ranked_losses(torch.tensor([2, 0]), losses), torch.tensor([0.75, 0.5]))


def test_a_fresh_epoch_scores_every_row_and_feeds_the_record_with_the_epoch(tmp_path):
    built = parts(make_config(str(tmp_path)))
    built.losses.record, built.planner.epoch = Record(), 2
    losses = built.losses.losses_for(rows([4, 5, 6]), model=None)
    assert torch.allclose(losses, torch.tensor([0.4, 0.5, 0.6]))
    assert built.scorer.scored == [[4, 5, 6]] and built.stats.selection_forwards == 3
    ((ids, recorded, margins, epoch),) = built.losses.record.events
    assert ids == [4, 5, 6] and recorded == pytest.approx([0.4, 0.5, 0.6]) and margins is not None and epoch == 2
    assert len(built.losses.store) == 0  # plain SB keeps no store


def test_a_stale_epoch_read_without_a_plan_looks_known_ids_up_and_scores_only_the_others(tmp_path):
    built = parts(make_config(str(tmp_path), sb_staleness=2))
    built.losses.store.update(torch.tensor([4, 6]), torch.tensor([2.0, 3.0]), epoch=0)
    built.planner.epoch = 1  # stale, and not planned
    losses = built.losses.losses_for(rows([4, 5, 6]), model=None)
    assert torch.allclose(losses, torch.tensor([2.0, 0.5, 3.0]))
    assert built.scorer.scored == [[5]] and built.stats.stale_lookups == 2
    assert built.losses.store.lookup(torch.tensor([5]))[1].tolist() == [1]  # stored under the epoch it was scored in


def test_observed_losses_of_every_rank_are_stored_alike_and_each_rank_gets_its_own_back(tmp_path):
    config = make_config(str(tmp_path), sb_staleness=2)

    def on_each_rank(accelerator):
        built = parts(config, accelerator)
        built.planner.epoch = 3
        mine = torch.tensor([0, 1]) + 2 * accelerator.process_index
        back = built.losses.observe(mine.to(META), (mine / 10).to(META))
        return back, built.losses.store.lookup(torch.arange(4))

    _, results, errors = run_ranks(on_each_rank)
    assert errors == [None, None], errors
    assert torch.allclose(results[0][0], torch.tensor([0.0, 0.1]))
    assert torch.allclose(results[1][0], torch.tensor([0.2, 0.3]))
    for stored, epochs in (result[1] for result in results):
        assert torch.allclose(stored, torch.arange(4) / 10) and epochs.tolist() == [3] * 4


def test_a_streams_id_far_beyond_the_rows_read_is_refused_before_the_store_grows_to_it(tmp_path):
    built = parts(make_config(str(tmp_path), sb_staleness=2))
    with pytest.raises(ValueError, match="renumber the ids densely"):
        built.losses.observe(torch.tensor([10**10]), torch.tensor([1.0]))
    sized = parts(make_config(str(tmp_path), sb_staleness=2)).losses
    sized.attach(sampler_over([3, 0, 9]))  # a dataset with positions: its ids are known, the store sized once
    assert len(sized.store) == 10 and not sized.stream


def test_a_failing_selection_forward_yields_nan_until_a_gather_carries_the_error(tmp_path):
    built = parts(make_config(str(tmp_path)))

    def bad_label(model, inputs, with_margins=False):
        raise BadRowsError("a class label outside the classes", [1])

    built.losses.scorer = bad_label
    losses = built.losses.losses_for(rows([7, 8]), model=None)
    assert bool(torch.isnan(losses).all())
    failure = built.losses.take_failure()
    assert "8" in str(failure) and built.losses.take_failure() is None  # named by its id, handed over once


def test_the_state_holds_the_store_labels_and_irreducible_losses(tmp_path):
    config = make_config(str(tmp_path), sb_strategy="early_class_budget", sb_keep=0.5)
    built = parts(config)
    built.losses.store.update(torch.tensor([0, 2]), torch.tensor([0.5, 1.5]), epoch=1)
    built.losses.labels.update(torch.tensor([0, 2]), torch.tensor([3, 1]))
    built.losses.irreducible = IrreducibleLosses(torch.tensor([0.1, 0.2, 0.3]))
    state = built.losses.state_dict()
    assert set(state) == {"store", "labels", "irreducible"}

    restored = parts(config).losses
    restored.load_state_dict(state)
    stored, epochs = restored.store.lookup(torch.tensor([0, 1, 2]))
    assert torch.allclose(stored, torch.tensor([0.5, float("nan"), 1.5]), equal_nan=True)
    assert epochs.tolist() == [1, -1, 1]
    assert restored.labels.lookup(torch.tensor([0, 1, 2])).tolist() == [3, -1, 1]
    assert torch.allclose(restored.irreducible.losses, torch.tensor([0.1, 0.2, 0.3]))
