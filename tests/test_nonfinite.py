"""`NonfiniteGuard`: a NaN/inf training loss stops the run before its optimizer step, an epoch whose every scored
loss was non-finite stops it at the epoch's end, on every rank together."""

import pytest
import torch
from engine_parts import ONE_PROCESS
from thread_ranks import META, run_ranks

from hf_selective_backprop.engine.accounting import SelectionStats
from hf_selective_backprop.engine.nonfinite import NONFINITE_CAUSE, NonfiniteGuard


def _guard(accelerator=ONE_PROCESS) -> NonfiniteGuard:
    return NonfiniteGuard(accelerator, SelectionStats())


def test_a_non_finite_training_loss_stops_the_run_before_its_optimizer_step():
    guard = _guard()
    guard.observe_training_loss(torch.tensor(0.5))
    guard.fail_if_training_loss_was_nonfinite(step=0)  # a finite step passes
    guard.observe_training_loss(torch.tensor(0.5))
    guard.observe_training_loss(torch.tensor(float("nan")))  # the second micro-batch of step 2
    with pytest.raises(RuntimeError, match=r"training loss of step 2 was NaN or inf \(this process: 1 non-finite"):
        guard.fail_if_training_loss_was_nonfinite(step=1)
    assert guard.stats.nonfinite_losses == 1
    guard.fail_if_training_loss_was_nonfinite(step=2)  # counted afresh each step


def test_an_epoch_whose_every_scored_loss_was_non_finite_stops_the_run_unless_rows_were_planned():
    guard = _guard()
    guard.count_scored(torch.tensor([float("nan"), float("inf")]))
    assert guard.stats.nonfinite_losses == 2
    guard.fail_if_every_loss_was_nonfinite(epoch=0, planned=True)  # planned rows train: the run progresses
    guard.count_scored(torch.tensor([float("nan"), float("inf")]))
    with pytest.raises(RuntimeError, match=r"every per-example loss scored in epoch 1 was NaN or inf") as raised:
        guard.fail_if_every_loss_was_nonfinite(epoch=1, planned=False)
    assert NONFINITE_CAUSE in str(raised.value)


def test_one_finite_loss_in_the_epoch_is_progress_and_the_next_epoch_counts_afresh():
    guard = _guard()
    guard.count_scored(torch.tensor([float("nan"), 1.0]))
    guard.fail_if_every_loss_was_nonfinite(epoch=0, planned=False)
    assert (guard.epoch_scored, guard.epoch_nonfinite) == (0, 0)
    guard.fail_if_every_loss_was_nonfinite(epoch=1, planned=False)  # an epoch that scored nothing


def test_a_rank_whose_training_loss_was_non_finite_stops_every_rank():
    def on_each_rank(accelerator):
        guard = _guard(accelerator)
        loss = float("inf") if accelerator.process_index == 1 else 1.0
        guard.observe_training_loss(torch.tensor(loss).to(META))
        guard.fail_if_training_loss_was_nonfinite(step=4)

    _, _, errors = run_ranks(on_each_rank)
    assert [type(error) for error in errors] == [RuntimeError, RuntimeError]
    assert "this process: 0 non-finite" in str(errors[0]) and "this process: 1 non-finite" in str(errors[1])
