"""A rank's own model buffers (BatchNorm statistics): copied out for its checkpoint, put back once on resume."""

import torch
from torch import nn

from hf_selective_backprop.engine.model_buffers import ResumedBuffers, model_buffers


def _model() -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    model.register_buffer("scratch", torch.ones(1), persistent=False)  # not in its state: not saved
    return model


def test_the_saved_buffers_are_the_models_persistent_ones_copied_to_the_host():
    model = _model()
    saved = model_buffers(model)
    assert set(saved) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
    model[1].running_mean += 1.0
    assert torch.equal(saved["1.running_mean"], torch.zeros(3))  # a copy, not the model's tensor


def test_a_resumed_rank_puts_its_own_buffers_back_once():
    trained = _model()
    trained[1].running_mean.fill_(2.0)
    resumed = ResumedBuffers()
    resumed.saved = model_buffers(trained)
    model = _model()
    resumed.restore(model)
    assert torch.equal(model[1].running_mean, torch.full((3,), 2.0)) and resumed.saved is None
    model[1].running_mean.zero_()
    resumed.restore(model)  # nothing left to restore: the model's own statistics stay
    assert torch.equal(model[1].running_mean, torch.zeros(3))
