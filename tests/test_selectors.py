"""Selection strategies: each rule's counts, probabilities, weights, state and determinism."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from hf_selective_backprop.config import SelectiveBackpropConfig
from hf_selective_backprop.selectors import (
    ComposerSelector,
    Kath18Selector,
    PercentileSelector,
    ReweightedPercentileSelector,
    TopKSelector,
    UniformSelector,
    build_selector,
    keep_count,
)
from hf_selective_backprop.selectors.history import LossHistory

NAN, INF = float("nan"), float("inf")


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def frequencies(indices: list[torch.Tensor], n: int) -> torch.Tensor:
    return torch.bincount(torch.cat(indices), minlength=n).double()


# --------------------------------------------------------------------------- SB (PercentileSelector)


def test_sb_probability_is_percentile_to_the_beta_on_known_history():
    selector = PercentileSelector(beta=2.0, history_size=8)
    selector.history.add(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # The batch joins the history first: {1, 2, 3, 4, 2.5, 5}; CDF(2.5) = 3/6, CDF(5) = 6/6.
    p = selector.probabilities(torch.tensor([2.5, 5.0]))
    torch.testing.assert_close(p, torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(selector.history.cdf(torch.tensor([0.5, 3.0])), torch.tensor([0.0, 4 / 6]))


@pytest.mark.parametrize("beta", [1.0, 2.0, 3.0])
def test_sb_kept_fraction_is_one_over_beta_plus_one(beta):
    selector = PercentileSelector(beta=beta, history_size=1024)
    g, losses = gen(1), torch.rand(200, 128, generator=gen(2))
    kept = sum(selector.select(batch, g).indices.numel() for batch in losses)
    assert kept / losses.numel() == pytest.approx(1 / (beta + 1), abs=0.015)
    assert selector.expected_keep_fraction() == pytest.approx(1 / (beta + 1))


def test_sb_floor_respected_and_expected_fraction_accounts_for_it():
    selector = PercentileSelector(beta=2.0, history_size=1024, min_prob=0.3)
    g, losses = gen(3), torch.rand(200, 128, generator=gen(4))
    kept = 0
    for batch in losses:
        assert selector.probabilities(batch).min() >= 0.3
        kept += selector.select(batch, g).indices.numel()
    assert kept / losses.numel() == pytest.approx(selector.expected_keep_fraction(), abs=0.015)


def test_sb_probabilities_monotone_in_loss():
    selector = PercentileSelector(beta=2.5, history_size=64)
    selector.history.add(torch.randn(64, generator=gen(5)))
    losses = torch.randn(50, generator=gen(6))
    p = selector.probabilities(losses)
    assert (p[torch.argsort(losses)].diff() >= 0).all()


def test_sb_non_finite_losses_never_selected_nor_recorded():
    selector = PercentileSelector(beta=0.5, history_size=32, min_prob=1.0)  # keeps every finite row
    losses = torch.tensor([1.0, NAN, 2.0, INF, -INF, 3.0])
    selection = selector.select(losses, gen())
    assert selection.indices.tolist() == [0, 2, 5]
    assert selector.history.values().tolist() == [1.0, 2.0, 3.0]
    selector.select(torch.tensor([NAN, NAN]), gen())
    assert len(selector.history) == 3


def test_history_ring_buffer_wraps_around_oldest_first():
    history = LossHistory(4)
    history.add(torch.tensor([1.0, 2.0, 3.0]))
    history.add(torch.tensor([4.0, 5.0, 6.0]))
    assert history.values().tolist() == [3.0, 4.0, 5.0, 6.0]
    history.add(torch.arange(10.0, 17.0))  # longer than the buffer: only its last 4 survive
    assert history.values().tolist() == [13.0, 14.0, 15.0, 16.0]
    assert history.cdf(torch.tensor([14.0])).item() == 0.5


def test_history_and_sb_state_dict_round_trip():
    selector = PercentileSelector(beta=2.0, history_size=5)
    for batch in torch.rand(3, 4, generator=gen(7)):
        selector.select(batch, gen())
    clone = PercentileSelector(beta=2.0, history_size=99)
    clone.load_state_dict(selector.state_dict())
    assert clone.history.size == 5
    assert torch.equal(clone.history.values(), selector.history.values())
    batch = torch.rand(6, generator=gen(8))
    assert torch.equal(clone.select(batch, gen(9)).indices, selector.select(batch, gen(9)).indices)
    assert torch.equal(clone.history.values(), selector.history.values())  # same wrap position


# --------------------------------------------------------------------------- fixed-count rules


@pytest.mark.parametrize(
    ("keep", "n", "count"), [(0.5, 10, 5), (0.5, 5, 3), (1 / 3, 3, 1), (0.01, 10, 1), (1.0, 7, 7), (0.3, 0, 0)]
)
def test_keep_count_rounds_half_up_with_minimum_one(keep, n, count):
    assert keep_count(keep, n) == count


@pytest.mark.parametrize("cls", [TopKSelector, ComposerSelector, UniformSelector])
@pytest.mark.parametrize(("keep", "n"), [(0.5, 10), (0.25, 128), (1 / 3, 7), (0.01, 20), (1.0, 9)])
def test_fixed_count_rules_keep_exactly_their_count_without_duplicates(cls, keep, n):
    selector = cls(keep)
    indices = selector.select(torch.rand(n, generator=gen(n)), gen()).indices
    assert indices.numel() == keep_count(keep, n)
    assert indices.unique().numel() == indices.numel()
    assert selector.expected_keep_fraction() == keep
    assert selection_is_sorted(indices)


def selection_is_sorted(indices: torch.Tensor) -> bool:
    return bool((indices.diff() > 0).all())


@pytest.mark.parametrize("cls", [TopKSelector, ComposerSelector, UniformSelector])
def test_fixed_count_rules_reject_bad_keep(cls):
    for keep in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            cls(keep)


def test_topk_picks_exactly_the_largest_and_breaks_ties_by_position():
    losses = torch.tensor([0.3, 5.0, 0.1, 2.0, 4.0, 0.2])
    assert TopKSelector(0.5).select(losses, gen()).indices.tolist() == [1, 3, 4]
    assert TopKSelector(0.5).select(torch.ones(6), gen()).indices.tolist() == [0, 1, 2]
    ties = torch.tensor([1.0, 3.0, 2.0, 3.0, 3.0])
    assert TopKSelector(0.4).select(ties, gen()).indices.tolist() == [1, 3]
    # Non-finite rows are dropped before counting: 3 finite rows, keep 2.
    assert TopKSelector(0.5).select(torch.tensor([NAN, 1.0, INF, 3.0, 2.0]), gen()).indices.tolist() == [3, 4]


def test_composer_probabilities_use_composer_percentiles():
    keep = 0.25
    losses = torch.tensor([0.7, 0.1, 0.9, 0.3])  # ranks 2, 0, 3, 1
    expected = ((torch.tensor([2, 0, 3, 1], dtype=torch.float64) + 0.5) / 4) ** (1 / keep - 1)
    torch.testing.assert_close(ComposerSelector(keep).probabilities(losses), expected / expected.sum())


def test_composer_draws_higher_losses_more_often():
    losses = torch.randperm(10, generator=gen(10)).float()
    selector, g, draws = ComposerSelector(0.3), gen(11), 3000
    counts = frequencies([selector.select(losses, g).indices for _ in range(draws)], 10)
    by_rank = counts[torch.argsort(losses)]
    assert by_rank[:3].mean() < by_rank[3:7].mean() < by_rank[7:].mean()
    # Exact inclusion probabilities of successive sampling without replacement, from all
    # 10 * 9 * 8 ordered draws.
    p = selector.probabilities(losses).tolist()
    inclusion = torch.zeros(10, dtype=torch.float64)
    for a, b, c in itertools.permutations(range(10), 3):
        inclusion[[a, b, c]] += p[a] * p[b] / (1 - p[a]) * p[c] / (1 - p[a] - p[b])
    assert inclusion.sum().item() == pytest.approx(3.0)
    torch.testing.assert_close(counts / draws, inclusion, atol=0.04, rtol=0)


def test_uniform_ignores_losses_and_is_uniform():
    selector = UniformSelector(0.25)
    assert UniformSelector.needs_losses is False
    same = selector.select(torch.zeros(40), gen(12)).indices
    assert torch.equal(same, selector.select(torch.randn(40), gen(12)).indices)
    g = gen(13)
    counts = frequencies([selector.select(torch.zeros(40), g).indices for _ in range(2000)], 40)
    assert counts.sum() == 2000 * 10
    assert (counts / 2000 - 0.25).abs().max() < 0.05  # 5 standard errors


@pytest.mark.parametrize("cls", [TopKSelector, ComposerSelector, UniformSelector])
def test_fixed_count_rules_deterministic_given_seed(cls):
    losses = torch.rand(50, generator=gen(14))
    assert torch.equal(cls(0.3).select(losses, gen(15)).indices, cls(0.3).select(losses, gen(15)).indices)


# --------------------------------------------------------------------------- Kath18


def test_kath18_draws_batch_size_rows_with_replacement_and_weights_one_over_np():
    selector = Kath18Selector(presample=3, importance_weighting=True, variance_start=False, batch_size=8)
    losses = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 9.0] * 2)
    selection = selector.select(losses, gen(16))
    assert selection.indices.numel() == 8
    assert selection.indices.unique().numel() < 8  # the two heavy rows get drawn repeatedly
    p = Kath18Selector.probabilities(losses)
    torch.testing.assert_close(selection.weights, (1.0 / (24 * p[selection.indices])).float())
    assert selector.produces_weights and selector.expected_keep_fraction() == pytest.approx(1 / 3)


def test_kath18_frequencies_proportional_to_loss_and_weighted_mean_unbiased():
    losses = torch.tensor([0.0, 0.5, 1.0, 2.0, 4.5, 0.5])
    selector, g = Kath18Selector(3, True, False, batch_size=4000), gen(17)
    selections = [selector.select(losses, g) for _ in range(5)]  # iid draws: 20000 in all
    freq = frequencies([s.indices for s in selections], 6) / 20000
    torch.testing.assert_close(freq, (losses / losses.sum()).double(), atol=0.012, rtol=0)
    estimates = torch.stack([s.weights * losses[s.indices] for s in selections])
    assert estimates.mean().item() == pytest.approx(losses.mean().item(), rel=0.01)


def test_kath18_zero_losses_can_be_drawn_and_all_zero_is_uniform():
    p = Kath18Selector.probabilities(torch.tensor([0.0, 1.0, 2.0]))
    assert (p > 0).all()
    torch.testing.assert_close(
        Kath18Selector.probabilities(torch.zeros(4)), torch.full((4,), 0.25, dtype=torch.float64)
    )
    assert (Kath18Selector.probabilities(torch.tensor([-1.0, 1.0]))[0] < 1e-5).item()  # negatives count as 0


def test_kath18_small_selection_batch_still_draws_batch_size():
    for variance_start in (False, True):
        selector = Kath18Selector(3, True, variance_start, batch_size=16)
        selection = selector.select(torch.tensor([1.0, NAN, 2.0, 3.0]), gen(18))
        assert selection.indices.numel() == 16 and selection.weights.numel() == 16
        assert set(selection.indices.tolist()) <= {0, 2, 3}
    empty = Kath18Selector(3, True, False, batch_size=4).select(torch.tensor([NAN, INF]), gen())
    assert empty.indices.numel() == 0 and empty.weights.numel() == 0


def test_kath18_without_weighting_returns_no_weights():
    selector = Kath18Selector(3, False, False, batch_size=4)
    assert not selector.produces_weights
    assert selector.select(torch.rand(12), gen()).weights is None


def test_kath18_variance_start_turns_on_at_the_threshold_and_stays_on():
    b, n = 4, 12
    selector = Kath18Selector(3, True, True, batch_size=b)
    threshold = (n + 3 * b) / (3 * b)  # 2.0
    assert selector.tau_threshold(n) == threshold
    flat = torch.ones(n)  # tau = 1: never worth it
    for _ in range(50):
        selection = selector.select(flat, gen())
        assert not selector.started
        assert selection.indices.unique().numel() == b  # uniform phase: without replacement
        assert torch.equal(selection.weights, torch.ones(b))
    assert selector.tau == pytest.approx(1.0, abs=0.01)
    skewed = torch.zeros(n)
    skewed[0] = 1.0  # one-hot scores: tau = sqrt(n) = 3.46
    tau_skewed = Kath18Selector.variance_reduction(Kath18Selector.probabilities(skewed))
    assert tau_skewed == pytest.approx(math.sqrt(n), rel=1e-4)
    # EMA from ~1 towards 3.46: expect the start after k steps with 1*0.9**k + 3.46*(1-0.9**k) > 2.
    expected_steps = math.ceil(math.log((tau_skewed - threshold) / (tau_skewed - selector.tau)) / math.log(0.9))
    steps = 0
    while not selector.started:
        selector.select(skewed, gen())
        steps += 1
    assert steps == expected_steps
    state = selector.state_dict()
    assert state["started"] is True and state["tau"] > threshold
    for _ in range(30):  # flat batches pull the average back under the threshold: stays on
        selector.select(flat, gen())
    assert selector.started and selector.tau < threshold
    restored = Kath18Selector(3, True, True, batch_size=b)
    restored.load_state_dict(selector.state_dict())
    assert restored.started and restored.tau == selector.tau


def test_kath18_deterministic_given_seed():
    losses = torch.rand(30, generator=gen(19))
    a = Kath18Selector(3, True, False, 10).select(losses, gen(20))
    b = Kath18Selector(3, True, False, 10).select(losses, gen(20))
    assert torch.equal(a.indices, b.indices) and torch.equal(a.weights, b.weights)


# --------------------------------------------------------------------------- reweighted SB


def test_reweighted_sb_weighted_sum_is_unbiased():
    # 64 copies of 16 distinct losses: the history only ever holds copies of this batch, so
    # P_i = max((rank_i / 16) ** 2, 0.05) is the same on every call, and each call is 64
    # independent replicates of selecting from the 16 losses.
    base = torch.linspace(0.05, 3.0, 16)
    losses = base.repeat(64)
    selector = ReweightedPercentileSelector(beta=2.0, history_size=1024)
    p = selector.probabilities(losses)
    torch.testing.assert_close(p[:16], ((torch.arange(1, 17) / 16) ** 2).clamp_min(0.05))
    g, calls = gen(21), 300
    sums, weight_sums, plain = torch.zeros(calls, 64), torch.zeros(calls, 64), torch.zeros(calls, 64)
    for t in range(calls):
        s = selector.select(losses, g)
        replicate = s.indices // 16
        sums[t].index_add_(0, replicate, s.weights * losses[s.indices])
        weight_sums[t].index_add_(0, replicate, s.weights)
        plain[t].index_add_(0, replicate, losses[s.indices])
    torch.testing.assert_close(selector.probabilities(losses), p)
    # Documented choice: w_i = mean(P) / P_i, so E[sum of w * loss over kept] = mean(P) * full sum.
    target, draws = p.mean() * base.sum(), sums.numel()
    se = sums.std() / math.sqrt(draws)
    assert abs(sums.mean() - target) < 4 * se
    assert abs(weight_sums.mean() - p.mean() * 16) < 4 * weight_sums.std() / math.sqrt(draws)
    assert plain.mean() - target > 20 * se  # unweighted selection is biased towards high losses


def test_reweighted_sb_weights_bounded_by_the_floor():
    selector = ReweightedPercentileSelector(beta=3.0, prob_floor=0.1)
    assert selector.produces_weights and selector.min_prob == 0.1
    g = gen(22)
    for batch in torch.rand(50, 64, generator=gen(23)):
        s = selector.select(batch, g)
        assert s.weights.numel() == s.indices.numel()
        assert s.weights.max() <= 1.0 / 0.1 + 1e-6
    assert ReweightedPercentileSelector(beta=2.0, min_prob=0.2).min_prob == 0.2
    with pytest.raises(ValueError):
        ReweightedPercentileSelector(beta=2.0, prob_floor=0.0)


# --------------------------------------------------------------------------- build_selector


@pytest.fixture
def config(output_dir):
    def make(**kwargs) -> SelectiveBackpropConfig:
        return SelectiveBackpropConfig(output_dir=output_dir, report_to="none", use_cpu=True, **kwargs)

    return make


@pytest.mark.parametrize(
    ("kwargs", "cls"),
    [
        ({"sb_strategy": "sb"}, PercentileSelector),
        ({"sb_strategy": "topk"}, TopKSelector),
        ({"sb_strategy": "composer"}, ComposerSelector),
        ({"sb_strategy": "uniform"}, UniformSelector),
        ({"sb_strategy": "kath18"}, Kath18Selector),
    ],
)
def test_build_selector_builds_every_strategy(config, kwargs, cls):
    selector = build_selector(config(**kwargs))
    assert type(selector) is cls
    assert selector.expected_keep_fraction() == pytest.approx(1 / 3)


def test_build_selector_passes_the_flags(config):
    assert build_selector(config(sb_strategy="none")) is None
    sb = build_selector(config(sb_strategy="sb", sb_beta=1.0, sb_history_size=77, sb_min_prob=0.01))
    assert (sb.beta, sb.history.size, sb.min_prob) == (1.0, 77, 0.01)
    reweighted = build_selector(config(sb_strategy="sb", sb_keep=0.25, sb_importance_weighting=True))
    assert type(reweighted) is ReweightedPercentileSelector and reweighted.beta == pytest.approx(3.0)
    assert build_selector(config(sb_strategy="topk", sb_keep=0.1)).keep == 0.1
    kath = build_selector(
        config(
            sb_strategy="kath18",
            sb_presample=4.0,
            sb_importance_weighting=True,
            sb_variance_start=True,
            per_device_train_batch_size=32,
        )
    )
    assert (kath.presample, kath.importance_weighting, kath.variance_start, kath.batch_size) == (4.0, True, True, 32)
    assert not kath.started
