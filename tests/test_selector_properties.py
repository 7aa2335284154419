"""Property tests: for any loss vector and setting, every rule keeps its invariants."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_selective_backprop.selectors import (
    ComposerSelector,
    Kath18Selector,
    PercentileSelector,
    ReweightedPercentileSelector,
    TopKSelector,
    UniformSelector,
    keep_count,
)

SETTINGS = settings(max_examples=60, deadline=None)

finite_losses = st.lists(st.floats(-10.0, 1e4, allow_nan=False, width=32), min_size=1, max_size=64)
# Mostly finite, sometimes NaN or +-inf: these must never be selected.
any_losses = st.lists(
    st.one_of(
        st.floats(0.0, 1e4, allow_nan=False, width=32),
        st.sampled_from([float("nan"), float("inf"), -float("inf")]),
    ),
    min_size=0,
    max_size=64,
)
keeps = st.floats(0.01, 1.0)
seeds = st.integers(0, 2**31 - 1)


def tensor(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def finite_rows(losses: torch.Tensor) -> set[int]:
    return set(torch.isfinite(losses).nonzero().squeeze(1).tolist())


@SETTINGS
@given(
    history=finite_losses,
    losses=finite_losses,
    beta=st.floats(0.1, 5.0),
    floor=st.floats(0.0, 1.0),
    size=st.integers(1, 128),
)
def test_sb_probabilities_in_floor_one_and_monotone(history, losses, beta, floor, size):
    selector = PercentileSelector(beta, size, floor)
    selector.history.add(tensor(history))
    losses = tensor(losses)
    p = selector.probabilities(losses)
    assert ((p >= floor - 1e-7) & (p <= 1.0)).all()
    # Equal losses may differ by an ulp (vectorized pow's tail lanes round differently); allow float32 noise.
    assert (p[torch.argsort(losses)].diff() >= -1e-6).all()
    assert 0.0 <= selector.expected_keep_fraction() <= 1.0 + 1e-9


@SETTINGS
@given(losses=any_losses, beta=st.floats(0.1, 5.0), seed=seeds, weighted=st.booleans())
def test_sb_selects_distinct_finite_rows(losses, beta, seed, weighted):
    selector = (ReweightedPercentileSelector if weighted else PercentileSelector)(beta, 32)
    losses = tensor(losses)
    selection = selector.select(losses, torch.Generator().manual_seed(seed))
    rows = selection.indices.tolist()
    assert len(set(rows)) == len(rows) and set(rows) <= finite_rows(losses)
    assert torch.isfinite(selector.history.values()).all()
    if weighted:
        assert selection.weights.shape == selection.indices.shape
        assert (selection.weights > 0).all() and torch.isfinite(selection.weights).all()


@SETTINGS
@given(
    losses=any_losses, keep=keeps, seed=seeds, cls=st.sampled_from([TopKSelector, ComposerSelector, UniformSelector])
)
def test_fixed_count_rules_keep_their_count_of_distinct_finite_rows(losses, keep, seed, cls):
    losses = tensor(losses)
    finite = finite_rows(losses)  # base.Selector drops non-finite rows for every rule
    selection = cls(keep).select(losses, torch.Generator().manual_seed(seed))
    rows = selection.indices.tolist()
    assert selection.weights is None
    assert len(rows) == keep_count(keep, len(finite))
    assert len(set(rows)) == len(rows) and set(rows) <= finite


@SETTINGS
@given(losses=finite_losses, keep=keeps)
def test_topk_keeps_no_row_smaller_than_a_dropped_row(losses, keep):
    losses = tensor(losses)
    kept = TopKSelector(keep).select(losses, torch.Generator()).indices
    dropped = torch.ones(losses.numel(), dtype=torch.bool)
    dropped[kept] = False
    if dropped.any():
        assert losses[kept].min() >= losses[dropped].max()


@SETTINGS
@given(
    losses=any_losses,
    presample=st.floats(1.0, 8.0),
    batch_size=st.integers(1, 48),
    weighted=st.booleans(),
    variance_start=st.booleans(),
    seed=seeds,
)
def test_kath18_draws_batch_size_finite_rows(losses, presample, batch_size, weighted, variance_start, seed):
    selector = Kath18Selector(presample, weighted, variance_start, batch_size)
    losses = tensor(losses)
    finite = finite_rows(losses)
    selection = selector.select(losses, torch.Generator().manual_seed(seed))
    assert selection.indices.numel() == (batch_size if finite else 0)
    assert set(selection.indices.tolist()) <= finite
    if weighted:
        assert selection.weights.shape == selection.indices.shape
        assert (selection.weights > 0).all() and torch.isfinite(selection.weights).all()
    else:
        assert selection.weights is None


@SETTINGS
@given(losses=st.lists(st.floats(-10.0, 1e4, allow_nan=False), min_size=1, max_size=64))
def test_kath18_probabilities_are_a_distribution_monotone_in_loss(losses):
    losses = torch.tensor(losses, dtype=torch.float64)
    p = Kath18Selector.probabilities(losses)
    assert (p > 0).all() and abs(p.sum().item() - 1.0) < 1e-9
    assert (p[torch.argsort(losses)].diff() >= 0).all()
    tau = Kath18Selector.variance_reduction(p)
    assert 1.0 - 1e-6 <= tau <= losses.numel() ** 0.5 + 1e-6
