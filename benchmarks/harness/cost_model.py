"""The paper's cost model (Jiang et al., section 3): what an epoch should cost, per example, in training forwards F.

Traditional trains every example: a forward, a backward and an optimizer step, (1 + r) F, where r is
what the backward and the step cost per forward (r = 2 when a backward costs two forwards). A
selective strategy scores a share of the examples it reads with a selection forward of phi F each
(SB: every example; Stale-SB with staleness n: about 1/n of them; uniform and InfoBatch's planned
rows: none) and trains the kept fraction s:

    cost = phi * scored F + s (1 + r) F,    ideal speedup = (1 + r) / (phi * scored + s (1 + r))

The benchmark scripts (benchmarks/bench_selection_pass.py, benchmarks/gpu_throughput.py via
`gpu_report.throughput_rows`, benchmarks/sft_report.py) measure phi, r and s and put this ideal beside
the speedup they measure. Pure arithmetic: no torch.
"""

from __future__ import annotations

#: r when a backward costs two forwards (the paper's assumption) and the optimizer step is free.
PAPER_R = 2.0


def ideal_speedup(r: float, phi: float, kept: float, scored: float = 1.0) -> float:
    """Traditional's cost per example read over the strategy's: (1 + r) / (phi * scored + kept (1 + r)).

    ``kept``: the fraction of examples read that are trained (s); ``scored``: the fraction that get a
    selection forward (1 for SB, 1/n for Stale-SB, 0 for a selection made without scoring).
    Traditional (kept 1, scored 0) is 1.
    """
    return (1 + r) / (phi * scored + kept * (1 + r))


def r_from_times(step_seconds: float, forward_seconds: float) -> float:
    """r from the time of a training step (forward, backward, optimizer step) and of a training forward alone."""
    return step_seconds / forward_seconds - 1


def forward_from_step(step_seconds: float, r: float) -> float:
    """F from the time of a training step, (1 + r) F."""
    return step_seconds / (1 + r)


def phi_from_times(selection_seconds: float, selection_forwards: int, forward_seconds_per_example: float) -> float:
    """phi: the selection forward's seconds per scored example over the training forward's seconds per example."""
    return selection_seconds / selection_forwards / forward_seconds_per_example
