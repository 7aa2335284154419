"""The per-strategy JSON logs and the figures both the report and the plots read off them.

Shared here so that `report` (text) and `plots` (figures) each depend on this module and not
on each other.
"""

from __future__ import annotations

import glob
import json
import os

from .strategies import DEFAULT_STRATEGIES

FACTORS = (1.0, 1.1, 1.2, 1.4)
CLOCKS = {"wall": "train_wall_seconds", "cpu": "train_cpu_seconds"}
BASELINE = "traditional"
_ORDER = (*DEFAULT_STRATEGIES, "sb-warmup", "topk")


def load_logs(folder: str) -> dict[str, dict]:
    """`<folder>/<strategy>.json` logs, in the canonical strategy order."""
    logs = {}
    for path in glob.glob(os.path.join(folder, "*.json")):
        with open(path) as handle:
            log = json.load(handle)
        if isinstance(log, dict) and "evals" in log and "strategy" in log:
            logs[log["strategy"]] = log
    rank = {name: i for i, name in enumerate(_ORDER)}
    return dict(sorted(logs.items(), key=lambda item: (rank.get(item[0], len(rank)), item[0])))


def final_error(log: dict) -> float:
    return log["evals"][-1]["error"]


def breakdown(log: dict) -> dict:
    """Wall seconds of training (evaluation excluded) split as in the paper's Figure 1."""
    stats, timings = log["stats"], log.get("timings", {})
    total = log["train_wall_seconds"]
    selection_forward = stats.get("selection_forward_seconds", 0.0)
    overhead = stats.get("selection_overhead_seconds", 0.0)
    data = stats.get("data_seconds", 0.0)
    train = timings.get("train_step_seconds", 0.0) + timings.get("optimizer_seconds", 0.0)
    other = max(total - selection_forward - overhead - data - train, 0.0)
    return {
        "selection_forward": selection_forward,
        "selection_overhead": overhead,
        "training": train,
        "data": data,
        "other": other,
        "total": total,
    }
