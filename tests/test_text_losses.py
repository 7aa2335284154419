"""Per-example losses equal the model's own loss for every text task, with label smoothing and num_items_in_batch."""

import pytest
import torch
from text_tiny import (
    NEGATIVE,
    POSITIVE,
    causal_lm,
    padded_batch,
    sequence_classifier,
    tiny_bart,
    tiny_t5,
    token_classifier,
    token_labels,
    word_tokenizer,
)
from transformers.trainer_pt_utils import LabelSmoother

from hf_selective_backprop import losses
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
    with pytest.raises(ValueError, match="task must be one of classification, token-classification, causal-lm, "
                                         "seq2seq-lm"):
        ExampleLoss("translation")


@pytest.mark.parametrize("make_model", [tiny_t5, tiny_bart])
def test_encoder_decoder_loss_is_the_mean_over_each_examples_label_tokens(make_model):
    tokenizer = word_tokenizer(POSITIVE + NEGATIVE)
    model = make_model(tokenizer).eval()
    sources, targets = POSITIVE + NEGATIVE, ["great", "bad acting", "i was bored , worse plot", "fine"] * 2
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    labels = tokenizer(targets, padding=True, return_tensors="pt")["input_ids"].masked_fill(
        tokenizer(targets, padding=True, return_tensors="pt")["attention_mask"] == 0, -100)
    assert model_task(model) == "seq2seq-lm"
    outputs = forward(model, batch, labels)
    loss_fn = per_example_loss_for(model)
    sums, counts = loss_fn.sums_and_counts(outputs, labels)
    assert torch.equal(counts, (labels != -100).sum(dim=1).float())
    assert torch.allclose(sums.sum() / counts.sum(), outputs.loss, atol=1e-6)
    one = torch.nn.functional.cross_entropy(outputs.logits[1], labels[1], ignore_index=-100)
    assert torch.allclose(loss_fn(outputs, labels)[1], one, atol=1e-6)
    # The Trainer smooths an encoder-decoder's labels without shifting them.
    smoothed = per_example_loss_for(model, label_smoothing=0.1).sums_and_counts(outputs, labels)
    expected = LabelSmoother(epsilon=0.1)(outputs, labels, shift_labels=False)
    assert torch.allclose(smoothed[0].sum() / smoothed[1].sum(), expected, atol=1e-6)


def test_tuple_outputs_with_the_loss_first_give_the_logits_after_it():
    """return_dict=False: (loss, logits) when the forward had labels, (logits,) without."""
    model = sequence_classifier(num_labels=3)
    batch, labels = padded_batch(LENGTHS), torch.tensor([0, 2, 1, 1, 0, 2])
    reference = per_example_loss_for(model)(forward(model, batch, labels), labels)
    with_labels = forward(model, batch, labels, return_dict=False)
    without = forward(model, batch, None, return_dict=False)
    assert with_labels[0].dim() == 0 and len(without) == 1
    for outputs in (with_labels, without):
        assert torch.allclose(per_example_loss_for(model)(outputs, labels), reference)


def test_dict_outputs_without_logits_use_their_one_other_tensor_or_say_what_to_pass():
    logits = torch.randn(4, 3)
    labels = torch.tensor([0, 1, 2, 1])
    expected = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    assert torch.allclose(ExampleLoss()({"loss": torch.tensor(1.0), "scores": logits}, labels), expected)
    with pytest.raises(ValueError, match=r"no 'logits'.*keys: \['a', 'b'\].*per_example_loss_func"):
        ExampleLoss()({"a": logits, "b": logits}, labels)


@pytest.mark.cpu_kernels
def test_token_losses_are_computed_in_chunks_that_bound_the_float32_copies(monkeypatch):
    """A large vocabulary in half precision: no float32 copy of all logits, the same losses."""
    generator = torch.Generator().manual_seed(0)
    vocabulary, rows, width = 5000, 3, 7
    logits = torch.randn(rows, width, vocabulary, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, vocabulary, (rows, width), generator=generator)
    labels[0, :2] = -100
    loss_fn = ExampleLoss("causal-lm")
    whole = loss_fn.sums_and_counts(logits, labels)
    largest = []
    cross_entropy = torch.nn.functional.cross_entropy

    def recording(input, *args, **kwargs):
        largest.append(input.numel())
        return cross_entropy(input, *args, **kwargs)

    monkeypatch.setattr(losses, "TOKEN_CHUNK_ELEMENTS", 2 * vocabulary)
    monkeypatch.setattr(losses.F, "cross_entropy", recording)
    chunked = loss_fn.sums_and_counts(logits, labels)
    # Two tokens' logits at a time: the float32 temporaries are 2 x vocabulary, not rows x width x vocabulary.
    assert max(largest) == 2 * vocabulary and len(largest) == rows * 3
    assert torch.equal(chunked[1], whole[1])
    assert torch.allclose(chunked[0], whole[0], rtol=1e-6)
    reference = cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), reduction="none",
                              ignore_index=-100).view(rows, width - 1).sum(1)
    assert torch.allclose(chunked[0], reference, rtol=1e-6)
