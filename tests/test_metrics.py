"""The accuracy metric loads from the package folder with no network."""

import socket

import numpy as np
import pytest
from transformers import EvalPrediction

from hf_selective_backprop.metrics import ACCURACY_PATH, compute_metrics, load_accuracy


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_evaluate_loads_the_local_module_offline(offline):
    import evaluate

    metric = evaluate.load(str(ACCURACY_PATH))
    assert metric.name == "accuracy"
    assert metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 2, 0]) == {"accuracy": 0.75}
    weighted = metric.compute(predictions=[0, 1], references=[0, 0], sample_weight=[3.0, 1.0])
    assert weighted == {"accuracy": 0.75}
    assert metric.compute(predictions=[0, 1, 1], references=[0, 1, 2], normalize=False) == {"accuracy": 2.0}
    assert isinstance(metric.compute(predictions=[1], references=[1])["accuracy"], float)


def test_compute_metrics_takes_logits_tuples_or_class_ids(offline):
    logits = np.array([[2.0, 0.1, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    labels = np.array([0, 1, 1, 0])
    assert compute_metrics(EvalPrediction(predictions=logits, label_ids=labels)) == {"accuracy": 0.75}
    assert compute_metrics(EvalPrediction(predictions=(logits, None), label_ids=labels)) == {"accuracy": 0.75}
    ids = logits.argmax(-1)
    assert compute_metrics(EvalPrediction(predictions=ids, label_ids=labels)) == {"accuracy": 0.75}
    assert load_accuracy() is load_accuracy()  # loaded once per process
