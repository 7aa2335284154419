"""The selection engine: what selection holds between steps, and how it saves and restores it.

`SelectionEngine` (`engine.py`) is the one object that holds selection state, through its collaborators: the
epoch's plan and read position (`epoch_planner.py`), the losses, their store and the example record's feed
(`loss_source.py`), the rows read, selected and queued (`step_filler.py`, `batch_rows.py`), a budget run's
spending (`budget_meter.py`), the non-finite checks (`nonfinite.py`) and each rank's model buffers
(`model_buffers.py`). The modules beside them are their parts: the loss store (`store.py`), the batch queue and
its padding (`queue.py`, `padding.py`), the epoch's plan, the run's length and its budget (`epoch_plan.py`,
`run_length.py`, `budget.py`, `phi_meter.py`, `schedule.py`), the selection forward (`scoring.py`), example ids
(`indexing.py`), irreducible losses for RHO-LOSS (`reference.py`), collectives and host copies (`distributed.py`,
`transfer.py`), streams (`streams.py`), counters (`accounting.py`) and checkpoints (`state_files.py`,
`checkpoints.py`, `run_signature.py`, `data_state.py`, `rotation.py`).
"""

from __future__ import annotations

import importlib

__all__ = ["WEIGHT_KEY", "EpochPlan", "PlannedSampler", "SelectionEngine"]

# Loaded on first use: the pure parts (store, queue) should not pay for importing Accelerate.
_LAZY = {
    "WEIGHT_KEY": ".batch_rows",
    "SelectionEngine": ".engine",
    "EpochPlan": ".epoch_plan",
    "PlannedSampler": ".epoch_plan",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
