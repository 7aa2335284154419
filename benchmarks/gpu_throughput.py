"""`make gpu-check`'s throughput section (docs/gpu.md): all 50,000 CIFAR-10 training images on one CUDA device.

    python benchmarks/gpu_throughput.py --output_dir OUT [--data CIFAR10]

One cycle each of Traditional, SB, Stale-SB (n=3: three epochs), InfoBatch (two epochs: the first has
no losses to prune by) and the uniform control, timm resnet18, batch 128, trained by the benchmark
harness (`run_strategy`) with `--sb_sync_timers` on so that the time split measures the work, not kernel
launches. F, r and phi are measured on one batch first (`timing.median_seconds`, which synchronises the
device); the table puts the cost model's ideal speedup (`cost_model`) beside the measured one.

Writes OUT/throughput.json (and each run's log under OUT/throughput/), which benchmarks/gpu_check.py puts
into its report, and prints the table. Without a CUDA device it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from harness.cost_model import r_from_times
from harness.gpu_report import render_throughput, run_section, throughput_rows
from harness.runner import run_strategy, write_log
from harness.settings import RunSettings
from harness.strategies import Strategy, build_strategy
from harness.timing import median_seconds
from harness.workloads import cifar10_workload

KEEP = 1 / 3
#: (strategy, epochs): one cycle of each.
PLAN = [("traditional", 1), ("sb", 1), ("stale-sb", 3), ("infobatch", 2), ("uniform", 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data", default="uoft-cs/cifar10", help="CIFAR-10 in the Hub's layout (a folder or Hub id)")
    options = parser.parse_args()
    result = run_section("throughput", options.output_dir, lambda out: throughput(options.data, out))
    if result is not None:
        print("\n".join(render_throughput(result)))
    return 0


def throughput(data: str, out: Path) -> dict:
    workload = cifar10_workload(data, None)
    costs = measure_costs(workload)
    settings = RunSettings(output_dir=str(out / "throughput"), num_train_epochs=1)
    logs = {}
    for name, epochs in PLAN:
        base = build_strategy(name, KEEP, 3, 0)
        overrides = dict(base.overrides)
        if overrides.get("sb_strategy") != "none":
            overrides["sb_sync_timers"] = True  # the time split measures the work, not kernel launches
        strategy = Strategy(base.name, base.label, overrides)
        log = run_strategy(strategy, workload, settings, epochs)
        write_log(log, str(out / "throughput" / f"{name}.json"))
        logs[name] = log
        torch.cuda.empty_cache()
    return {"train_examples": len(workload.train), "costs": costs, "rows": throughput_rows(logs, costs)}


def measure_costs(workload, repeats: int = 20) -> dict:
    """F (training forward), (1+r)F (forward, backward, SGD step) and the selection forward, per batch of 128."""
    from hf_selective_backprop.engine.scoring import SelectionScorer
    from hf_selective_backprop.losses import cross_entropy_per_example

    device = torch.device("cuda")
    model = workload.build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rows = workload.train.__getitems__(list(range(128)))
    batch = {k: torch.stack([r[k] for r in rows]).to(device) for k in ("pixel_values", "labels")}

    def forward():
        model.train()
        return model(**batch).loss

    def step():
        optimizer.zero_grad(set_to_none=True)
        forward().backward()
        optimizer.step()

    scorers = {p: SelectionScorer(cross_entropy_per_example, precision=p) for p in ("fp32", "bf16")}
    f, full = median_seconds(forward, repeats, device), median_seconds(step, repeats, device)
    selection = {p: median_seconds(lambda s=s: s(model, batch), repeats, device) for p, s in scorers.items()}
    return {"batch": 128, "forward_ms": 1e3 * f, "step_ms": 1e3 * full, "r": r_from_times(full, f),
            "phi": {p: t / f for p, t in selection.items()}}


if __name__ == "__main__":
    sys.exit(main())
