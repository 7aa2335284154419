"""Accuracy as an `evaluate` module that loads from this folder, with no network.

`evaluate.load("accuracy")` fetches its script from the Hub; `evaluate.load` on this
folder gives the same metric offline. The file must stay self-contained: `evaluate` copies
it into its modules cache and imports it from there.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = """
Accuracy is the proportion of correct predictions among the examples processed:
Accuracy = (TP + TN) / (TP + TN + FP + FN).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): Predicted class ids.
    references (`list` of `int`): Ground-truth class ids.
    normalize (`bool`, defaults to `True`): If False, return the number of correct predictions.
    sample_weight (`list` of `float`, defaults to None): Per-example weights.
Returns:
    accuracy (`float`): Fraction (or, with normalize=False, weighted count) of correct predictions.
Example:
    >>> accuracy = evaluate.load("hf_selective_backprop/metrics/accuracy")
    >>> accuracy.compute(references=[0, 1, 2, 0], predictions=[0, 1, 1, 0])
    {'accuracy': 0.75}
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references, normalize=True, sample_weight=None):
        correct = np.asarray(predictions) == np.asarray(references)
        weights = np.ones(len(correct)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        total = float(np.dot(correct, weights))
        if normalize:
            total = total / float(weights.sum()) if len(correct) else 0.0
        return {"accuracy": total}
