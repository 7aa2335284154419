"""Evaluation metrics that work offline, and the Trainer's `compute_metrics`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from .._optional import require

evaluate = require("evaluate", "hf_selective_backprop.metrics (the accuracy metric)")

ACCURACY_PATH = Path(__file__).resolve().parent / "accuracy"


@lru_cache(maxsize=1)
def load_accuracy() -> evaluate.EvaluationModule:
    """The local accuracy metric, loaded once; kept in memory so ranks share no cache files."""
    return evaluate.load(str(ACCURACY_PATH), keep_in_memory=True)


def compute_metrics(eval_pred) -> dict[str, float]:
    """`Trainer(compute_metrics=...)`: accuracy of the arg-max of the logits.

    Also accepts predictions already reduced to class ids (by ``preprocess_logits_for_metrics``).
    """
    predictions, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(predictions, tuple):
        predictions = predictions[0]
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    result = load_accuracy().compute(predictions=predictions.reshape(-1), references=labels.reshape(-1))
    return {"accuracy": float(result["accuracy"])}
