"""The lossless frontier's report: which settings count as lossless, each family's largest saving, the uniform
curve at equal saving, and the report written from seed folders."""

import json

import pytest

from harness.frontier import (
    against_uniform_curve,
    baseline,
    collect,
    family,
    largest_lossless,
    uniform_at,
    write_frontier_report,
)


def log(name, accuracy, seconds, backwards=100, forwards=0, forward_seconds=0.0):
    return {
        "strategy": name, "label": name.upper(), "evals": [{"epoch": 1, "error": 1 - accuracy / 100}],
        "train_wall_seconds": seconds, "train_cpu_seconds": seconds,
        "stats": {"backwards": backwards, "examples_seen": 100, "selection_forwards": forwards,
                  "selection_forward_seconds": forward_seconds},
        "provenance": {"commit": "abc", "clean_tree": True, "versions": {}},
    }


def seed_logs(offset):
    """Traditional at 90 % +- offset; a gentle InfoBatch that stays lossless, a harsh one that does not, an SB
    setting with a selection forward, and each one's uniform control."""
    return {
        "traditional": log("traditional", 90.0 + offset, 100.0),
        "infobatch-r0.3": log("infobatch-r0.3", 89.9 + offset, 80.0, backwards=80),
        "infobatch-r0.7": log("infobatch-r0.7", 88.0 + offset, 50.0, backwards=50),
        "stale-sb-n2-keep0.5": log("stale-sb-n2-keep0.5", 89.0 + offset, 70.0, backwards=50, forwards=50,
                                   forward_seconds=20.0),
        "uniform-for-infobatch-r0.3": log("uniform-for-infobatch-r0.3", 89.0 + offset, 80.0, backwards=80),
        "uniform-for-infobatch-r0.7": log("uniform-for-infobatch-r0.7", 86.0 + offset, 50.0, backwards=50),
        "uniform-for-stale-sb-n2-keep0.5": log("uniform-for-stale-sb-n2-keep0.5", 86.0 + offset, 50.0,
                                               backwards=50),
    }


def seeds():
    return {"seed0": seed_logs(-0.5), "seed1": seed_logs(0.5)}


def test_a_family_is_the_strategy_without_its_knobs_and_every_control_is_uniform():
    assert family("stale-sb-n2-keep0.5") == "stale-sb"
    assert family("infobatch-r0.3-delta0.75") == "infobatch"
    assert family("stale-rholoss") == "stale-rholoss"
    assert family("uniform-for-infobatch-r0.3") == "uniform"


def test_lossless_is_at_least_traditionals_mean_minus_one_sd_in_every_seed():
    data = seeds()
    base = baseline(data)
    assert base.mean == pytest.approx(90.0) and base.floor == pytest.approx(90.0 - 0.7071, abs=1e-3)
    best = largest_lossless(collect(data), base)
    assert best["infobatch"].name == "infobatch-r0.3"  # r0.7 saves more but ends 2 points below
    assert best["stale-sb"] is None
    assert best["uniform"] is None  # the gentlest random subset ends a point below
    assert list(best) == ["infobatch", "stale-sb", "uniform"]


def test_a_setting_missing_a_seed_is_shown_but_never_called_lossless():
    data = seeds()
    data["seed1"].pop("infobatch-r0.3")
    best = largest_lossless(collect(data), baseline(data))
    assert best["infobatch"] is None


def test_savings_are_each_seeds_traditional_time_over_the_runs_and_the_cost_model_prices_selection_forwards():
    setting = next(s for s in collect(seeds()) if s.name == "stale-sb-n2-keep0.5")
    assert setting.saving == [pytest.approx(100 / 70)] * 2
    # 1 s per backward (Traditional: 100 s / 100), 0.4 s per selection forward: 50 + 20 = 70 s.
    assert setting.model_saving == [pytest.approx(100 / 70)] * 2
    assert setting.margin == [pytest.approx(3.0)] * 2


def test_the_uniform_curve_is_read_at_the_settings_own_saving_with_traditional_at_one():
    data = seeds()
    # Seed 0's uniform points: (1, 89.5) Traditional, (1.25, 88.5), (2, 85.5).
    assert uniform_at(data, "seed0", 1.0) == pytest.approx(89.5)
    assert uniform_at(data, "seed0", 1.625) == pytest.approx(87.0)
    assert uniform_at(data, "seed0", 2.5) is None
    stale = next(s for s in collect(data) if s.name == "stale-sb-n2-keep0.5")
    # At 100/70 = 1.4286x the curve is at 88.5 - (0.1786 / 0.75) * 3 = 87.786; the setting is at 88.5.
    assert against_uniform_curve(stale, data)[0] == pytest.approx(88.5 - (88.5 - 3 * (100 / 70 - 1.25) / 0.75))


def test_the_report_names_the_largest_lossless_saving_and_the_target(tmp_path):
    for seed, logs in seeds().items():
        (tmp_path / seed).mkdir()
        for name, entry in logs.items():
            (tmp_path / seed / f"{name}.json").write_text(json.dumps(entry))
    path = write_frontier_report(str(tmp_path), "Frontier", target=1.2)
    text = open(path).read()
    assert (tmp_path / "frontier.png").stat().st_size > 0
    assert "| INFOBATCH-R0.3 | 2 | 89.90 ± 0.71 | yes | 1.25 ± 0.00x |" in text
    assert "| infobatch | 1.25x | yes | yes | **met** |" in text
    assert "| stale-sb | 1.00x (none lossless) | no | no | no |" in text
    assert "stale-sb: none; most accurate: STALE-SB-N2-KEEP0.5" in text
