"""Pinned outcomes of seeded runs: a refactor of the selection machinery must not change them.

Each case trains the tiny classifier for 2 epochs and compares the run's counters, exactly, and its final
weights, within a tolerance, with the values recorded when the case was last pinned. The counters pin every
selection decision; the weights pin what was done with them (a loss weighted differently, a step skipped). The
weights are compared within WEIGHT_TOLERANCE, not bit for bit: CPUs of other models, and the same CPU under
ATEN_CPU_CAPABILITY=default (make test runs this file so too), round the same run differently by about 2e-7.

Re-pin after a deliberate change of behaviour with `python tests/test_engine_regression.py`, which writes the
weights to REFERENCE_WEIGHTS and prints the counters for PINNED_COUNTS.
"""

import contextlib
import json
import os
import re
import tempfile
from unittest import mock

import pytest
import torch
from tiny import TinyClassifier, make_config, make_dataset

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine import SelectionEngine

# Run again on the CPU's plain kernels by make test (ATEN_CPU_CAPABILITY=default).
pytestmark = pytest.mark.cpu_kernels

COUNTS = ("examples_seen", "selection_forwards", "stale_lookups", "kept", "backwards", "optimizer_steps")
TESTS = os.path.dirname(os.path.abspath(__file__))
REFERENCE_WEIGHTS = os.path.join(TESTS, "engine_regression_weights.json")
# 500 times the largest difference rounding made (1.8e-7 to 2.1e-7 on the weights here, of magnitude up to 0.8,
# between a CPU's own kernels and ATEN_CPU_CAPABILITY=default); one more or one fewer step, or a loss weighted
# differently, moves them by far more.
WEIGHT_TOLERANCE = 1e-4

CASES = {
    "sb": dict(sb_strategy="sb", sb_beta=1.0),
    "stale-sb": dict(sb_strategy="sb", sb_beta=1.0, sb_staleness=2),
    "stale-sb-after-loading": dict(sb_strategy="sb", sb_beta=1.0, sb_staleness=2),
    "kath18": dict(sb_strategy="kath18", sb_importance_weighting=True),
}

PINNED_COUNTS = {
    "sb": dict(examples_seen=512, selection_forwards=512, stale_lookups=0, kept=195, backwards=192, optimizer_steps=24),
    # Re-pinned when stale epochs moved before loading (their decisions are made at the epoch's start,
    # so a row queued across the epoch boundary no longer refreshes its stored loss first); the
    # lookup-after-loading path, still used for epochs that cannot be planned, keeps the old value.
    "stale-sb": dict(
        examples_seen=512, selection_forwards=256, stale_lookups=256, kept=238, backwards=232, optimizer_steps=29
    ),
    "stale-sb-after-loading": dict(
        examples_seen=512, selection_forwards=256, stale_lookups=256, kept=234, backwards=232, optimizer_steps=29
    ),
    "kath18": dict(
        examples_seen=512, selection_forwards=512, stale_lookups=0, kept=176, backwards=176, optimizer_steps=22
    ),
}


def _run(output_dir, case):
    """The case's final weights (float32, by parameter name) and its counters."""
    # The path still used for epochs that cannot be planned before loading.
    after_loading = (
        mock.patch.object(SelectionEngine, "plans_before_loading", property(lambda self: False))
        if case == "stale-sb-after-loading"
        else contextlib.nullcontext()
    )
    with after_loading:
        trainer = SelectiveBackpropTrainer(
            model=TinyClassifier(), args=make_config(output_dir, **CASES[case]), train_dataset=make_dataset()
        )
        trainer.train()
    weights = {name: tensor.detach().to(torch.float32).flatten() for name, tensor in trainer.model.state_dict().items()}
    with open(os.path.join(output_dir, "sb_stats.json")) as handle:
        stats = json.load(handle)
    return weights, {key: stats[key] for key in COUNTS}


def _reference_weights(case):
    with open(REFERENCE_WEIGHTS) as handle:
        return {name: torch.tensor(values) for name, values in json.load(handle)[case].items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_seeded_run_is_unchanged(output_dir, case):
    weights, counts = _run(output_dir, case)
    assert counts == PINNED_COUNTS[case]
    reference = _reference_weights(case)
    assert sorted(weights) == sorted(reference)
    for name, tensor in weights.items():
        torch.testing.assert_close(
            tensor, reference[name], rtol=0, atol=WEIGHT_TOLERANCE, msg=lambda detail, name=name: f"{name}: {detail}"
        )


def test_tolerance_is_far_below_a_small_change(output_dir):
    """The same run with a learning rate 1 % higher ends more than ten tolerances away from the reference."""
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(),
        args=make_config(output_dir, **CASES["sb"], learning_rate=1.01 * make_config(output_dir).learning_rate),
        train_dataset=make_dataset(),
    )
    trainer.train()
    reference = _reference_weights("sb")
    weights = trainer.model.state_dict()
    drift = max((weights[name].flatten() - values).abs().max().item() for name, values in reference.items())
    assert drift > 10 * WEIGHT_TOLERANCE


def test_make_test_runs_these_again_on_the_plain_kernels():
    with open(os.path.join(os.path.dirname(TESTS), "Makefile")) as handle:
        recipe = re.search(r"^test: .*\n((?:\t.*\n)+)", handle.read(), re.MULTILINE).group(1)
    assert re.search(r"^\tATEN_CPU_CAPABILITY=default \$\(PY\) -m pytest .*-m cpu_kernels$", recipe, re.MULTILINE)


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the suite runs (tests/conftest.py)
    recorded = {}
    for case in sorted(CASES):
        with tempfile.TemporaryDirectory() as folder:
            weights, counts = _run(folder, case)
        recorded[case] = {name: [float(f"{value:.8g}") for value in flat.tolist()] for name, flat in weights.items()}
        print(case, counts)
    with open(REFERENCE_WEIGHTS, "w") as handle:  # one line per tensor
        handle.write(json.dumps(recorded, indent=1).replace("\n   ", " ").replace("\n  ]", " ]") + "\n")
