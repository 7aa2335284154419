"""`StepFiller`: loaded selection batches in, the rows to train queued, whole optimizer steps out."""

from __future__ import annotations

import contextlib

import torch
from accelerate import Accelerator

from ..selectors import Selector
from . import distributed, streams, transfer
from .accounting import SelectionStats
from .batch_rows import WEIGHT_KEY, batch_device, batch_length, check_rows, take_rows
from .data_state import DataState
from .epoch_planner import EpochPlanner
from .loss_source import LossSource
from .nonfinite import NonfiniteGuard
from .queue import BatchQueue
from .scoring import SelectionScorer


class StepFiller:
    """Reads selection batches, queues the rows each one trains (planned ones, those a stream's rule decides from
    the store, or those the strategy selects from scored losses) and pops them as micro-batches. It holds the
    queue and the data pipeline's random state; the epoch's plan and rule come from ``planner``, losses from
    ``losses``, and the non-finite ones among them are counted by ``nonfinite``.

    ``batch_size``: the training micro-batch size, per process; ``padding``: the `BatchQueue` pad values and side
    for variable-length (text) rows.
    """

    def __init__(self, args, selector: Selector, scorer: SelectionScorer, accelerator: Accelerator,
                 stats: SelectionStats, generator: torch.Generator, planner: EpochPlanner, losses: LossSource,
                 nonfinite: NonfiniteGuard, batch_size: int, padding: dict | None = None):
        self.args, self.selector, self.scorer, self.accelerator = args, selector, scorer, accelerator
        self.stats, self.generator, self.nonfinite = stats, generator, nonfinite
        self.planner, self.losses = planner, losses
        self.batch_size = batch_size
        self.index_column = args.sb_index_column
        self.queue = BatchQueue(**(padding or {}))
        self.data_state = DataState({})
        self.inputs_checked = False
        self.progress_now = 0.0  # the run's share done, as of the latest selection_on

    def read(self, epoch_iterator) -> dict | None:
        """The next selection batch, or None at the end of the epoch."""
        skips, seeded_before_checkpoint = self.planner.next_read()
        with torch.random.fork_rng(devices=[]) if seeded_before_checkpoint else contextlib.nullcontext():
            with self.stats.timer("data_seconds"):
                for _ in range(skips):
                    self.data_state.next(epoch_iterator)
                return self.data_state.next(epoch_iterator)

    def ready(self) -> bool:
        """True on every process once each holds a full optimizer step (a collective)."""
        rows_per_step = self.batch_size * self.args.gradient_accumulation_steps
        return distributed.all_true(self.accelerator, len(self.queue) >= rows_per_step)

    def check_inputs(self, batch: dict, model: torch.nn.Module) -> None:
        """At the run's first batch, one selection forward on one example: a model that cannot take
        --sb_selection_scale / --sb_selection_channels_last inputs fails now, not when the schedule
        (sb_start, warm-up epochs) first turns selection on."""
        self.inputs_checked = True
        needs = streams.id_needs(self.args, self.selector, stream=self.planner.sampler is None)
        if self.index_column not in batch and needs is not None:
            # Without ids the store and the epoch's plan cannot key examples (it used to fail in the store); a
            # stream whose columns are not known before reading it fails here, at its first batch.
            raise ValueError(streams.missing_ids_message(self.index_column, batch, needs))
        check_rows(batch)
        if self.selector.needs_losses:
            self.scorer.check_inputs(model, {k: v[:1] for k, v in batch.items() if k != self.index_column})

    def add_batch(self, batch: dict, selecting: bool, model: torch.nn.Module) -> None:
        """Queue a loaded selection batch's rows to train: all, the planned ones, or those selected.

        The host waits for the device once per selection batch on one process: for the batch's ids in a
        planned epoch, else for its losses (docs/gpu.md counts the synchronisations).
        """
        self.stats.examples_loaded += batch_length(batch)
        host_ids = None
        plan = self.planner.epoch_plan
        loaded = batch
        if selecting and plan is not None:
            (host_ids,) = transfer.to_host(batch[self.index_column])
            decided = plan.is_decided(host_ids)
            if bool(decided.any()):
                self._push(self._planned_rows(batch, host_ids, decided))  # counted as seen when planned
            done = bool(decided.all())
            if bool(plan.scored.any()):
                # Scoring rows without a finite stored loss runs collectives, and ranks read different
                # numbers of them: a rank with none joins them with no rows, unless no rank has any.
                done = distributed.all_true(self.accelerator, done)
            if done:
                return
            undecided = (~decided).nonzero().squeeze(1)
            batch, host_ids = take_rows(batch, transfer.to_device(undecided, batch_device(batch))), host_ids[undecided]
        if selecting and self.planner.stream_rule is not None and self._decide_from_store(batch):
            return
        self.stats.examples_seen += batch_length(batch)
        if selecting:
            self._select(batch, model, host_ids, loaded)
        else:
            self._push(dict(batch))

    def _decide_from_store(self, batch: dict) -> bool:
        """A stream's batch decided from its rows' stored losses (InfoBatch's rule by id, not by position):
        pruned rows were loaded but cost no forward or backward. False: the strategy decides after scoring."""
        (host_ids,) = transfer.to_host(batch[self.index_column])
        with self.stats.timer("selection_overhead_seconds"):
            stored, _ = self.losses.store.lookup(host_ids)
            selection = self.selector.plan_rows(stored, self.generator, self.planner.stream_rule, self.progress_now)
        if self.accelerator.num_processes > 1:
            check_plans_agree(self.selector, distributed.flags_of_every_rank(self.accelerator, selection is None))
        if selection is None:
            return False
        size = batch_length(batch)
        self.stats.examples_seen += size
        self.stats.considered += size
        self.stats.kept += selection.indices.numel()
        device = batch_device(batch)
        rows = take_rows(batch, transfer.to_device(selection.indices, device))
        if selection.weights is not None:
            rows[WEIGHT_KEY] = transfer.to_device(selection.weights.float(), device)
        self._push(rows)
        return True

    def _planned_rows(self, batch: dict, host_ids: torch.Tensor, decided: torch.Tensor) -> dict:
        positions = decided.nonzero().squeeze(1)
        device = batch_device(batch)
        rows = take_rows(batch, transfer.to_device(positions, device))
        weights = self.planner.epoch_plan.weights
        if weights is not None:
            rows[WEIGHT_KEY] = transfer.to_device(weights[host_ids[positions]], device)
        return rows

    def _select(self, batch: dict, model: torch.nn.Module, host_ids: torch.Tensor | None, loaded: dict) -> None:
        size = batch_length(batch)
        losses = self.losses.losses_for(batch, model, host_ids, loaded)
        with self.stats.timer("selection_overhead_seconds"):
            population = None
            # A stream without ids gathers placeholder ids: only the losses are used then.
            ids = batch.get(self.index_column, torch.zeros(size, dtype=torch.int64))
            failure = self.losses.take_failure()
            if self.args.sb_history_scope == "global" and self.accelerator.num_processes > 1:
                all_ids, population, mine = distributed.gather_pairs(self.accelerator, ids, losses, failure)
                ids, losses = all_ids[mine], population[mine]
                population = self.losses.ranked_losses(all_ids, population)
            elif failure is not None:
                raise failure  # no gather follows to carry it to the other ranks (docs/distributed.md)
            elif self.selector.uses_reference_losses:
                ids, losses = transfer.to_host(ids.to(torch.int64), losses)  # still one copy
            else:
                (losses,) = transfer.to_host(losses)
            selection = self.selector.select(self.losses.ranked_losses(ids, losses), self.generator,
                                             population=population)
            self.stats.considered += size
            self.stats.kept += selection.indices.numel()
            self.nonfinite.count_scored(losses)
            device = batch_device(batch)
            rows = take_rows(batch, transfer.to_device(selection.indices, device))
            if selection.weights is not None:
                rows[WEIGHT_KEY] = transfer.to_device(selection.weights, device)
        self._push(rows)

    def _push(self, rows: dict) -> None:
        if self.selector.produces_weights and WEIGHT_KEY not in rows:
            rows[WEIGHT_KEY] = torch.ones(batch_length(rows), device=batch_device(rows))
        self.queue.push(rows)

    def next_step(self, device) -> list[dict]:
        """Exactly gradient_accumulation_steps micro-batches of exactly the batch size, on ``device``."""
        with self.stats.timer("selection_overhead_seconds"):
            micro_batches = [
                {k: transfer.to_device(v, device) for k, v in self.queue.pop(self.batch_size).items()}
                for _ in range(self.args.gradient_accumulation_steps)
            ]
        trained = self.batch_size * self.args.gradient_accumulation_steps
        self.stats.training_forwards += trained
        self.stats.backwards += trained
        self.stats.optimizer_steps += 1
        return micro_batches

    def state_dict(self) -> dict:
        """This process's queued rows and the random state of its dataset and collator."""
        return {"queue": self.queue.state_dict(), "data": self.data_state.state_dict()}

    def load_state_dict(self, ranks: dict[int, dict], own: dict | None) -> None:
        """The queued rows of every saved rank in ``ranks`` (taken over by this one), and ``own``'s data state
        (None: no saved rank continues here)."""
        self.queue.clear()
        for saved in ranks.values():
            # Saved rows are on the CPU; new rows arrive on the device, and a popped batch may join both.
            self.queue.push({key: value.to(self.args.device) for key, value in saved["queue"]["rows"].items()})
        if own is not None:
            self.data_state.load_state_dict(own.get("data"))


def check_plans_agree(selector: Selector, undecided: list[bool]) -> None:
    """`Selector.plan_rows` must return None on every rank or on none: ranks that score a batch gather its losses,
    and ranks that planned it would not join them."""
    if len(set(undecided)) > 1:
        ranks = [rank for rank, flag in enumerate(undecided) if flag]
        raise ValueError(
            f"{type(selector).__name__}.plan_rows returned None (score these rows) on rank(s) {ranks} of "
            f"{len(undecided)} and a selection on the others: it must return None on every rank or on none, "
            "deciding from the epoch's rule and the run's progress, which every rank shares"
        )
