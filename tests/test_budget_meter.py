"""`BudgetMeter`: a budget run's spending over every process, when it ends the run, phi measured then priced in,
and its checkpoint state."""

import dataclasses
from types import SimpleNamespace

import pytest
from engine_parts import ONE_PROCESS
from thread_ranks import run_ranks

from hf_selective_backprop.engine.accounting import SelectionStats
from hf_selective_backprop.engine.budget import PHI_GIVEN, PHI_MEASURED, PHI_MEASURING, BudgetPlan
from hf_selective_backprop.engine.budget_meter import BudgetMeter
from hf_selective_backprop.engine.phi_meter import PhiMeasurement

# Half of a full run of cost 100 (target 50), a selection forward at half a training step's cost.
PLAN = BudgetPlan(budget=0.5, phi=0.5, full_cost=100.0, before_training=0.0, epochs=3.0, steps=10)


class Strategy:
    def __init__(self):
        self.fitted = []

    def fit_run(self, epochs: float) -> None:
        self.fitted.append(epochs)


def _meter(accelerator=ONE_PROCESS) -> BudgetMeter:
    return BudgetMeter(accelerator, SelectionStats(), Strategy())


def _step(meter: BudgetMeter, backwards: int, selection_forwards: int) -> None:
    meter.stats.backwards, meter.stats.selection_forwards = backwards, selection_forwards
    meter.count()


def test_a_run_without_a_budget_counts_nothing_and_saves_that_it_has_none():
    meter = _meter()
    meter.start(None)
    _step(meter, 100, 100)
    assert (meter.spent, meter.done, meter.summary()) == (0.0, False, {})
    assert meter.state_dict() == {"budget": None, "budget_spent": 0.0, "budget_done": False}


def test_the_budget_ends_the_run_when_half_another_step_would_reach_it():
    meter = _meter()
    meter.start(PLAN)
    assert meter.selector.fitted == [3.0] and meter.phi_meter is None  # a given phi is not measured
    _step(meter, 20, 20)  # 20 + 0.5 x 20 = 30 spent, and a step of 30 more would pass 50
    assert meter.spent == pytest.approx(30.0) and not meter.done and meter.progress() == pytest.approx(0.6)
    summary = meter.summary()
    assert summary.pop("cost_phi_source") == PHI_GIVEN
    assert summary == pytest.approx({"budget": 0.5, "cost_phi": 0.5, "budget_spent": 0.3})  # of the full cost
    _step(meter, 30, 30)  # 45 spent: half the next step of 15 reaches 50
    assert meter.spent == pytest.approx(45.0) and meter.done and meter.progress() == 1.0


def test_a_resumed_meter_continues_from_the_saved_plan_and_spending():
    meter = _meter()
    meter.start(PLAN)
    _step(meter, 20, 20)
    state = meter.state_dict()
    assert set(state) == {"budget", "budget_spent", "budget_done"}
    resumed = _meter()
    resumed.load_state_dict(state)
    assert resumed.budget == PLAN and resumed.spent == meter.spent and resumed.done == meter.done
    assert resumed.selector.fitted == [3.0]  # the strategy fits the epochs the budget buys


def test_a_measured_phi_makes_the_plan_anew_over_the_same_steps_and_prices_what_was_spent_at_it():
    measuring = dataclasses.replace(PLAN, phi_source=PHI_MEASURING)

    def replan(phi: float) -> BudgetPlan:
        return BudgetPlan(budget=0.5, phi=phi, full_cost=80.0, before_training=0.0, epochs=2.0, steps=99,
                          phi_source=PHI_MEASURED)

    meter = _meter()
    meter.start(measuring, replan)
    assert meter.phi_meter is not None
    measurements = iter([None, PhiMeasurement(phi=0.25, first_step=2, last_step=3, selection_ms=1.0,
                                              training_ms=4.0)])
    meter.phi_meter = SimpleNamespace(at_step=lambda accelerator, scored: next(measurements))
    _step(meter, 10, 10)
    assert meter.spent == pytest.approx(15.0)  # at the cost model's phi until it is measured
    _step(meter, 20, 20)
    assert (meter.budget.phi, meter.budget.full_cost, meter.budget.steps) == (0.25, 80.0, 10)
    assert meter.phi_meter is None and meter.selector.fitted == [3.0, 2.0]
    assert meter.spent == pytest.approx(25.0) and not meter.done  # 20 + 0.25 x 20; the target is 40


def test_every_rank_counts_the_cost_of_every_rank():
    def on_each_rank(accelerator):
        meter = _meter(accelerator)
        meter.start(PLAN)
        _step(meter, 10 * (accelerator.process_index + 1), 0)
        return meter.spent, meter.done

    _, results, errors = run_ranks(on_each_rank)
    assert errors == [None, None], errors
    assert results[0] == results[1] and results[0][0] == pytest.approx(30.0)
