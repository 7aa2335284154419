"""Coverage-centric selection (CCS, Zheng et al., ICLR 2023): the choice itself, early_coverage in a run, and the
record's `coverage` subset."""

import numpy
import pytest
import torch
from test_engine import CountingRows, N, train

from hf_selective_backprop.selectors import EarlyPruneSelector, keep_count
from hf_selective_backprop.selectors.coverage import coverage_choice


def test_the_hardest_tenth_is_dropped_and_every_level_of_difficulty_is_kept_evenly():
    scores = torch.linspace(0, 1, 1000)  # position i has the i-th lowest score
    chosen = coverage_choice(scores, 300, torch.Generator().manual_seed(0), strata=10, hard_cutoff=0.1)
    assert chosen.numel() == 300 and chosen.unique().numel() == 300
    assert int(chosen.max()) < 900  # the hardest 100 dropped as likely label issues
    per_stratum = torch.bincount(((scores[chosen] - 0) / (scores[899] / 10)).floor().clamp(max=9).long(),
                                 minlength=10)
    assert per_stratum.tolist() == [30] * 10  # hard-only would hold 0 of the easiest strata


def test_sparse_strata_are_kept_whole_and_the_rest_filled_from_the_dense_ones():
    # 900 easy examples crowd one stratum; 100 spread over the others are all kept.
    scores = torch.cat([torch.rand(900, generator=torch.Generator().manual_seed(1)) * 0.01,
                        torch.linspace(0.05, 1.0, 100)])  # from the third stratum of 50 on
    chosen = coverage_choice(scores, 300, torch.Generator().manual_seed(0), strata=50, hard_cutoff=0.0)
    assert set(range(900, 1000)) <= set(chosen.tolist())
    assert int((chosen < 900).sum()) == 200


def test_unscored_are_kept_first_and_the_cutoff_shrinks_rather_than_fall_short():
    scores = torch.arange(10.0)
    scores[3] = float("nan")
    chosen = coverage_choice(scores, 9, torch.Generator().manual_seed(0), hard_cutoff=0.5)
    assert chosen.numel() == 9 and 3 in chosen.tolist()
    assert coverage_choice(scores, 1, torch.Generator(), hard_cutoff=0.5).tolist() == [3]
    with pytest.raises(ValueError, match="count"):
        coverage_choice(scores, 11, torch.Generator())
    with pytest.raises(ValueError, match="hard_cutoff"):
        coverage_choice(scores, 2, torch.Generator(), hard_cutoff=1.0)


def test_the_same_generator_state_chooses_the_same_subset():
    scores = torch.rand(500, generator=torch.Generator().manual_seed(2))
    first = coverage_choice(scores, 150, torch.Generator().manual_seed(5))
    assert torch.equal(first, coverage_choice(scores, 150, torch.Generator().manual_seed(5)))


def test_early_coverage_keeps_its_choice_for_every_later_epoch():
    selector = EarlyPruneSelector(keep=0.3, by="coverage", num_epochs=4)
    losses = torch.linspace(0, 5, 1000)
    kept = selector.plan_epoch(losses, torch.Generator().manual_seed(0), 1).indices
    assert kept.numel() == keep_count(0.3, 1000) and int(kept.max()) < 900
    assert int((kept < 300).sum()) > 50  # easy examples stay, where the hardest 30 % would hold none
    assert torch.equal(selector.plan_epoch(torch.zeros(1000), torch.Generator(), 2).indices, kept)


def test_early_coverage_trains_its_subset_after_the_first_epoch(output_dir):
    rows = CountingRows()
    trainer = train(output_dir, rows, sb_strategy="early_coverage", sb_keep=0.25, num_train_epochs=3)
    kept = keep_count(0.25, N)
    assert int((rows.loads == 3).sum()) == kept and int((rows.loads == 1).sum()) == N - kept
    assert trainer.sb_stats["selection_forwards"] == 0 and trainer.sb_stats["backwards"] == N + 2 * kept


def test_the_records_coverage_subset_spans_the_mean_loss():
    from datasets import Dataset

    from hf_selective_backprop.record.pruning import kept_ids

    record = Dataset.from_dict({"id": list(range(200)), "mean_loss": numpy.linspace(0, 2, 200).tolist()})
    ids = kept_ids(record, numpy.arange(200), keep=0.3, by="coverage", seed=0, id_column="id")
    assert len(ids) == 60 and ids.max() < 180 and (ids < 60).sum() > 10
    hardest = kept_ids(record, numpy.arange(200), keep=0.3, by="mean_loss", seed=0, id_column="id")
    assert hardest.min() == 140
