"""The engine's collaborators built by hand, as `SelectionEngine` builds them, around small tensors and a fake
one-process accelerator (``ONE_PROCESS``), or the thread ranks of `thread_ranks` for several processes."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hf_selective_backprop.engine.accounting import SelectionStats
from hf_selective_backprop.engine.epoch_plan import PlannedSampler
from hf_selective_backprop.engine.epoch_planner import EpochPlanner
from hf_selective_backprop.engine.loss_source import LossSource
from hf_selective_backprop.engine.nonfinite import NonfiniteGuard
from hf_selective_backprop.engine.step_filler import StepFiller
from hf_selective_backprop.selectors import build_selector

#: What the collaborators read of an Accelerator, for one process on the CPU.
ONE_PROCESS = SimpleNamespace(num_processes=1, process_index=0, is_main_process=True, device=torch.device("cpu"))


class LossesOfX:
    """A selection scorer whose loss of each row is its ``x[:, 0]``; remembers the rows (by ``x[:, 1]``) it scored."""

    def __init__(self):
        self.scored: list[list[int]] = []

    def __call__(self, model, inputs: dict, with_margins: bool = False):
        self.scored.append(inputs["x"][:, 1].long().tolist())
        losses = inputs["x"][:, 0].float()
        return (losses, -losses) if with_margins else losses

    def check_inputs(self, model, inputs: dict) -> None:
        self.scored.append(inputs["x"][:, 1].long().tolist())


def rows(ids: list[int], losses: list[float] | None = None, device="cpu") -> dict:
    """A selection batch: ``x`` holds each row's loss (by default its id / 10) and its id."""
    ids_tensor = torch.tensor(ids)
    loss = torch.tensor(losses) if losses is not None else ids_tensor / 10
    batch = {"x": torch.stack([loss.float(), ids_tensor.float()], 1), "labels": torch.zeros(len(ids), dtype=torch.long),
             "index": ids_tensor}
    return {key: value.to(device) for key, value in batch.items()}


def sampler_over(ids: list[int], rows_per_round: int = 1) -> PlannedSampler:
    """The training loader's sampler over a dataset whose row p holds id ``ids[p]``, in order."""
    return PlannedSampler(range(len(ids)), torch.tensor(ids), rows_per_round)


def parts(config, accelerator=ONE_PROCESS, batch_size: int = 4, selection_batch_size: int = 4,
          forwards_in_lockstep: bool = False) -> SimpleNamespace:
    """A planner, loss source, non-finite guard and step filler sharing one strategy, counters and generator."""
    selector = build_selector(config)
    stats, generator, scorer = SelectionStats(), torch.Generator().manual_seed(0), LossesOfX()
    planner = EpochPlanner(config, selector, accelerator, stats, selection_batch_size)
    losses = LossSource(config, selector, scorer, accelerator, stats, planner, forwards_in_lockstep)
    nonfinite = NonfiniteGuard(accelerator, stats)
    filler = StepFiller(config, selector, scorer, accelerator, stats, generator, planner, losses, nonfinite,
                        batch_size)
    return SimpleNamespace(selector=selector, stats=stats, scorer=scorer, planner=planner, losses=losses,
                           nonfinite=nonfinite, filler=filler)
