"""`BudgetMeter`: what a budget run (--sb_budget) has spent, priced by its plan, and when the budget ends the run."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from functools import partial

import torch
from accelerate import Accelerator

from ..selectors import Selector
from . import distributed
from .accounting import SelectionStats
from .budget import PHI_MEASURING, BudgetPlan
from .phi_meter import PhiMeasurement, PhiMeter

logger = logging.getLogger(__name__)


class BudgetMeter:
    """A budget run's plan (`BudgetPlan`), the cost spent so far over every process, and whether the next step
    would overrun the budget. A plan whose phi is being measured is made anew (``replan``) once `PhiMeter` has
    timed phi on the run's first steps. Without a budget it holds nothing and counts nothing."""

    def __init__(self, accelerator: Accelerator, stats: SelectionStats, selector: Selector):
        self.accelerator, self.stats, self.selector = accelerator, stats, selector
        self.budget: BudgetPlan | None = None
        self.spent = 0.0  # cost spent, summed over processes (BudgetPlan.spent), as of the latest step
        self.done = False
        self.replan: Callable[[float], BudgetPlan] | None = None  # the budget's plan for a measured phi
        self.phi_meter: PhiMeter | None = None  # times phi on the first steps of a budget run given no phi
        self._totals: dict | None = None  # the counts the latest `spent` priced, over all processes

    def start(self, budget: BudgetPlan | None, replan: Callable[[float], BudgetPlan] | None = None) -> None:
        """The run's budget (None: the run has none), before its first step."""
        self.replan = replan
        if budget is not None:
            self._adopt(budget)
            self.spent, self.done = budget.before_training, False

    def _adopt(self, budget: BudgetPlan) -> None:
        self.budget = budget
        self.phi_meter = None
        if budget.phi_source == PHI_MEASURING:
            device_synchronize = None
            if self.accelerator.device.type != "cpu":
                device_synchronize = partial(torch.accelerator.synchronize, self.accelerator.device)
            self.phi_meter = PhiMeter(self.stats, device_synchronize)
        if budget.epochs is not None:
            self.selector.fit_run(budget.epochs)

    def count(self) -> None:
        """The cost spent up to the step about to run, the same on every process (a collective), and whether
        it ends the run: when half the cost of another such step would reach the budget."""
        if self.budget is None:
            return
        stats = self.stats
        totals = distributed.sum_over_processes(self.accelerator, {
            "backwards": stats.backwards, "selection": stats.selection_forwards, "reference": stats.reference_forwards,
        })
        if self.phi_meter is not None:
            measured = self.phi_meter.at_step(self.accelerator, totals["selection"])
            if measured is not None:
                self._price_at(measured)
        spent = self.budget.spent(totals["backwards"], totals["selection"], totals["reference"])
        step_cost, self.spent = spent - self.spent, spent
        self.done = spent + step_cost / 2 >= self.budget.target
        self._totals = totals

    def _price_at(self, measured: PhiMeasurement) -> None:
        """The plan made anew from the measured phi, and what was spent so far priced at it: the schedule
        follows the budget spent, so it moves by what the measurement changed, once."""
        before, measured_plan = self.budget, self.replan(measured.phi)
        # The schedule was built over the steps first planned, and spans the run by its share of the budget
        # spent: a resumed run rebuilds it over the same steps, so it must find them in the plan.
        self._adopt(dataclasses.replace(measured_plan, steps=before.steps))
        previous = self._totals
        self.spent = self.budget.spent(previous["backwards"], previous["selection"], previous["reference"])
        logger.info(
            "--sb_budget: phi measured on optimizer steps %d-%d: %.3f (a selection %.3f ms per scored example, a "
            "training step %.3f ms per trained example; the cost model's %.3f until now): the budget buys about "
            "%d optimizer steps (%d at the cost model's phi)",
            measured.first_step, measured.last_step, measured.phi, measured.selection_ms, measured.training_ms,
            before.phi, measured_plan.steps, before.steps,
        )

    def progress(self) -> float:
        """The share of the budget spent (1.0 once it ends the run)."""
        return 1.0 if self.done else self.budget.progress(self.spent)

    def summary(self) -> dict:
        """A budget run's plan and the share of the full run's cost spent so far (empty without a budget)."""
        if self.budget is None:
            return {}
        return {"budget": self.budget.budget, "cost_phi": self.budget.phi, "cost_phi_source": self.budget.phi_source,
                "budget_spent": self.spent / self.budget.full_cost}

    def state_dict(self) -> dict:
        """The plan and what it spent: a resumed run keeps them and ends at the same step."""
        return {"budget": None if self.budget is None else self.budget.state_dict(),
                "budget_spent": self.spent, "budget_done": self.done}

    def load_state_dict(self, state: dict) -> None:
        if state.get("budget") is not None:
            self._adopt(BudgetPlan.from_state_dict(state["budget"]))
            self.spent, self.done = state["budget_spent"], state["budget_done"]
