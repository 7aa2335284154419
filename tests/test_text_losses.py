"""Per-example losses equal the model's own loss for every text task, with label smoothing and num_items_in_batch."""

import pytest
import torch
from text_tiny import causal_lm, padded_batch, sequence_classifier, token_classifier, token_labels
from transformers.trainer_pt_utils import LabelSmoother

from hf_selective_backprop.losses import ExampleLoss, model_task, per_example_loss_for, weighted_loss

LENGTHS = [3, 7, 5, 9, 2, 6]


def forward(model, batch, labels, **kwargs):
    with torch.no_grad():
        return model(**batch, labels=labels, **kwargs)


def test_tasks_are_read_from_the_model():
    assert model_task(sequence_classifier()) == "classification"
    assert model_task(token_classifier()) == "token-classification"
    assert model_task(causal_lm()) == "causal-lm"
    assert model_task(torch.nn.Linear(2, 2)) == "classification"


@pytest.mark.parametrize(
    "num_labels, make_labels, problem_type",
    [
        (3, lambda n: torch.tensor([0, 2, 1, 1, 0, 2]), "single_label_classification"),
        (4, lambda n: torch.randint(0, 2, (n, 4)).float(), "multi_label_classification"),
        (1, lambda n: torch.randn(n), "regression"),
        (1, lambda n: torch.randn(n, 1), "regression"),
    ],
)
def test_sequence_classification_follows_problem_type_rules(num_labels, make_labels, problem_type):
    torch.manual_seed(1)
    model = sequence_classifier(num_labels=num_labels)
    batch, labels = padded_batch(LENGTHS), make_labels(len(LENGTHS))
    loss_fn = per_example_loss_for(model)
    # Before the model's first loss its problem_type is unset: the loss infers it as the model will.
    assert loss_fn.problem_type(labels) == problem_type
    outputs = forward(model, batch, labels)
    assert model.config.problem_type == problem_type
    per_example = loss_fn(outputs, labels)
    assert per_example.shape == (len(LENGTHS),)
    assert torch.allclose(per_example.mean(), outputs.loss, atol=1e-6)


def test_multi_output_regression_is_the_mean_over_outputs():
    model = sequence_classifier(num_labels=3, problem_type="regression")
    batch, labels = padded_batch(LENGTHS), torch.randn(len(LENGTHS), 3)
    outputs = forward(model, batch, labels)
    per_example = per_example_loss_for(model)(outputs, labels)
    assert torch.allclose(per_example, ((outputs.logits - labels) ** 2).mean(dim=1))
    assert torch.allclose(per_example.mean(), outputs.loss, atol=1e-6)


def test_single_label_ignored_rows_score_zero_and_do_not_count():
    model = sequence_classifier(num_labels=3)
    batch, labels = padded_batch(LENGTHS), torch.tensor([0, -100, 1, 2, -100, 1])
    outputs = forward(model, batch, labels)
    loss_fn = per_example_loss_for(model)
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    assert torch.equal(counts, torch.tensor([1.0, 0, 1, 1, 0, 1]))
    assert sums[1] == 0 and sums[4] == 0
    assert torch.allclose(sums.sum() / counts.sum(), outputs.loss, atol=1e-6)


def test_token_classification_is_the_mean_over_each_examples_labelled_tokens():
    model = token_classifier(num_labels=5)
    batch = padded_batch(LENGTHS)
    labels = token_labels(batch, 5)
    outputs = forward(model, batch, labels)
    loss_fn = per_example_loss_for(model)
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    assert torch.equal(counts, (labels != -100).sum(dim=1).float())
    # The model averages over every labelled token of the batch.
    assert torch.allclose(sums.sum() / counts.sum(), outputs.loss, atol=1e-6)
    per_token = torch.nn.functional.cross_entropy(outputs.logits[2], labels[2], ignore_index=-100)
    assert torch.allclose(loss_fn(outputs, labels)[2], per_token, atol=1e-6)


@pytest.mark.parametrize("side", ["right", "left"])
def test_causal_lm_shifts_labels_like_the_model(side):
    model = causal_lm()
    batch = padded_batch(LENGTHS, side=side)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    outputs = forward(model, batch, labels)
    loss_fn = per_example_loss_for(model)
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    # Token t predicts label t + 1, as in the Trainer's count: a right-padded text of L tokens has L - 1 targets.
    assert torch.equal(counts, (labels[:, 1:] != -100).sum(dim=1).float())
    if side == "right":
        assert torch.equal(counts, torch.tensor(LENGTHS).float() - 1)
    assert torch.allclose(sums.sum() / counts.sum(), outputs.loss, atol=1e-6)
    # With the Trainer's count the model returns sum / num_items_in_batch: so does the weighted loss at weight 1.
    items = torch.tensor(100)
    with_items = forward(model, batch, labels, num_items_in_batch=items)
    loss, per_example = weighted_loss(loss_fn, outputs, labels, torch.ones(len(LENGTHS)), items)
    assert torch.allclose(loss, with_items.loss, atol=1e-6)
    assert torch.allclose(per_example, sums / counts)


def test_gradient_accumulation_with_num_items_in_batch_gives_the_full_batch_loss():
    """Two micro-batches normalised by the step's token count add up to the one-batch loss."""
    model = causal_lm()
    batch = padded_batch(LENGTHS)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    loss_fn = per_example_loss_for(model)
    full = forward(model, batch, labels).loss
    halves = [slice(0, 2), slice(2, 6)]
    # The Trainer counts labels[..., 1:] for a causal LM.
    items = sum((labels[part, 1:] != -100).sum() for part in halves)
    total = 0.0
    for part in halves:
        micro = {key: value[part] for key, value in batch.items()}
        outputs = forward(model, micro, labels[part])
        total = total + weighted_loss(loss_fn, outputs, labels[part], torch.ones(part.stop - part.start), items)[0]
    assert torch.allclose(total, full, atol=1e-6)


@pytest.mark.parametrize("task", ["classification", "token-classification", "causal-lm"])
def test_label_smoothing_matches_the_trainers_label_smoother(task):
    models = {"classification": lambda: sequence_classifier(num_labels=3), "token-classification": token_classifier,
              "causal-lm": causal_lm}
    model = models[task]()
    batch = padded_batch(LENGTHS)
    if task == "classification":
        labels = torch.tensor([0, 2, 1, -100, 0, 2])
    elif task == "token-classification":
        labels = token_labels(batch, 5)
    else:
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    outputs = forward(model, batch, None)
    loss_fn = per_example_loss_for(model, label_smoothing=0.1)
    smoother = LabelSmoother(epsilon=0.1)
    shift = task == "causal-lm"
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    assert torch.allclose(sums.sum() / counts.sum(), smoother(outputs, labels, shift_labels=shift), atol=1e-6)
    items = torch.tensor(37)
    expected = smoother(outputs, labels, shift_labels=shift, num_items_in_batch=items)
    loss, _ = weighted_loss(loss_fn, outputs, labels, torch.ones(len(LENGTHS)), items)
    assert torch.allclose(loss, expected, atol=1e-6)
    # Smoothing changes the loss: the factor is not silently dropped.
    assert not torch.allclose(loss, weighted_loss(per_example_loss_for(model), outputs, labels,
                                                  torch.ones(len(LENGTHS)), items)[0])


def test_label_smoothing_is_not_applied_to_multi_label_and_refused_for_regression():
    model = sequence_classifier(num_labels=4, problem_type="multi_label_classification")
    batch, labels = padded_batch(LENGTHS), torch.randint(0, 2, (len(LENGTHS), 4)).float()
    outputs = forward(model, batch, labels)
    assert torch.allclose(per_example_loss_for(model, label_smoothing=0.1)(outputs, labels).mean(), outputs.loss)
    regression = sequence_classifier(num_labels=1)
    outputs = forward(regression, batch, torch.randn(len(LENGTHS)))
    with pytest.raises(ValueError, match="label_smoothing_factor smooths class labels.*regression"):
        per_example_loss_for(regression, label_smoothing=0.1)(outputs, torch.randn(len(LENGTHS)))


def test_weights_scale_each_examples_token_sum():
    model = token_classifier(num_labels=5)
    batch = padded_batch(LENGTHS)
    labels = token_labels(batch, 5)
    outputs = forward(model, batch, labels)
    loss_fn = per_example_loss_for(model)
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    weights = torch.tensor([0.0, 2.0, 1.0, 0.5, 0.0, 3.0])
    loss, _ = weighted_loss(loss_fn, outputs, labels, weights)
    assert torch.allclose(loss, (weights * sums).sum() / counts.sum())


def test_out_of_range_token_labels_name_the_column():
    model = token_classifier(num_labels=5)
    batch = padded_batch(LENGTHS)
    labels = token_labels(batch, 5)
    labels[0, 0] = 9
    outputs = forward(model, batch, None)
    with pytest.raises(ValueError, match=r"the 'tags' column holds \[9\], outside the model's 5 classes"):
        ExampleLoss("token-classification", label_name="tags")(outputs, labels)


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of classification, token-classification, causal-lm"):
        ExampleLoss("translation")
