"""Text models through SelectiveBackpropTrainer: padded batches, re-padded micro-batches, exact losses."""

import json
import os

import pytest
import torch
from datasets import Dataset
from text_tiny import sentiment_sentences, word_tokenizer
from tiny import make_config
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorForLanguageModeling,
    DataCollatorWithPadding,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainingArguments,
)

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.data.text import tokenize, train_wordpiece_tokenizer
from hf_selective_backprop.engine.checkpoints import RANK_STATE_FILE


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece_tokenizer(iter([sentiment_sentences()["text"]]), vocab_size=60, max_length=32)


def classifier(tokenizer, seed: int = 0) -> BertForSequenceClassification:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id,
                        num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def language_model(tokenizer, seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=16, n_layer=1, n_head=2,
                        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def classification_data(tokenizer, n: int = 160) -> Dataset:
    return tokenize(sentiment_sentences(n), tokenizer, "text", 32, label_column="label")


def lm_data(tokenizer, n: int = 96) -> Dataset:
    return tokenize(sentiment_sentences(n), tokenizer, "text", 32)


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


class RecordingTrainer(SelectiveBackpropTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches = getattr(self, "micro_batches", [])
        self.micro_batches.append({key: value.clone() for key, value in inputs.items()})
        return super().training_step(model, inputs, num_items_in_batch)


@pytest.mark.cpu_kernels
def test_none_is_exactly_the_trainer_on_padded_text(output_dir, tokenizer):
    settings = dict(per_device_train_batch_size=8, num_train_epochs=2, learning_rate=1e-3, report_to=[], use_cpu=True,
                    save_strategy="no", disable_tqdm=True, seed=0)
    reference = Trainer(model=classifier(tokenizer), args=TrainingArguments(output_dir=output_dir, **settings),
                        train_dataset=classification_data(tokenizer), processing_class=tokenizer)
    reference.train()
    ours = SelectiveBackpropTrainer(model=classifier(tokenizer), args=make_config(output_dir, sb_strategy="none",
                                                                                  **settings),
                                    train_dataset=classification_data(tokenizer), processing_class=tokenizer)
    ours.train()
    assert ours.state.global_step == reference.state.global_step
    assert torch.equal(weights(ours.model), weights(reference.model))


@pytest.mark.parametrize("side", ["right", "left"])
def test_sb_trains_a_text_classifier_on_micro_batches_padded_to_their_longest_row(output_dir, tokenizer, side):
    tokenizer.padding_side = side
    try:
        trainer = RecordingTrainer(
            model=classifier(tokenizer), processing_class=tokenizer, train_dataset=classification_data(tokenizer),
            args=make_config(output_dir, sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, sb_selection_batch_size=10, num_train_epochs=2,
                             learning_rate=1e-3),
        )
        trainer.train()
    finally:
        tokenizer.padding_side = "right"
    assert trainer.micro_batches and len(trainer.micro_batches) == 2 * trainer.state.global_step
    widths = set()
    for batch in trainer.micro_batches:
        mask, ids = batch["attention_mask"], batch["input_ids"]
        assert ids.shape[0] == 4 and batch["labels"].shape == (4,)
        lengths = mask.sum(dim=1)
        assert ids.shape[1] == int(lengths.max())  # no column of padding only
        assert bool((ids[mask == 0] == tokenizer.pad_token_id).all())
        real = mask.bool()
        # Real tokens sit on the tokenizer's side: [CLS] opens every row, [SEP] ends it.
        starts = real.int().argmax(dim=1)
        assert bool((ids[torch.arange(4), starts] == tokenizer.cls_token_id).all())
        if side == "right":
            assert bool(real[:, 0].all())
        else:
            assert bool(real[:, -1].all())
        widths.add(ids.shape[1])
    assert len(widths) > 1
    stats = trainer.sb_stats
    assert stats["backwards"] == stats["optimizer_steps"] * 8
    assert stats["selection_forwards"] == 2 * 160
    with open(os.path.join(output_dir, "sb_stats.json")) as handle:
        assert json.load(handle)["backwards"] == stats["backwards"]


def test_causal_lm_labels_are_repadded_with_minus_100(output_dir, tokenizer):
    trainer = RecordingTrainer(
        model=language_model(tokenizer), processing_class=tokenizer, train_dataset=lm_data(tokenizer),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        args=make_config(output_dir, sb_strategy="topk", per_device_train_batch_size=4, sb_selection_batch_size=12,
                         num_train_epochs=1, learning_rate=1e-3),
    )
    trainer.train()
    for batch in trainer.micro_batches:
        mask, labels = batch["attention_mask"], batch["labels"]
        assert labels.shape == batch["input_ids"].shape and labels.shape[1] == int(mask.sum(dim=1).max())
        assert bool((labels[mask == 0] == -100).all())
        assert torch.equal(labels[mask == 1], batch["input_ids"][mask == 1])


def test_weighted_token_loss_keeping_everything_is_the_trainers_loss_with_accumulation(output_dir, tokenizer):
    """sb with importance weights and P = 1 keeps every row with weight 1: the weighted token-sum loss over
    num_items_in_batch must then train exactly as the Trainer does with gradient accumulation."""
    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=1,
                    learning_rate=1e-2, lr_scheduler_type="constant", report_to=[], use_cpu=True,
                    save_strategy="no", disable_tqdm=True, seed=0, logging_steps=1)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    reference = Trainer(model=language_model(tokenizer), args=TrainingArguments(output_dir=output_dir, **settings),
                        train_dataset=lm_data(tokenizer), data_collator=collator, processing_class=tokenizer)
    reference.train()
    ours = RecordingTrainer(
        model=language_model(tokenizer), processing_class=tokenizer, train_dataset=lm_data(tokenizer),
        data_collator=collator,
        args=make_config(output_dir, sb_strategy="sb", sb_importance_weighting=True, sb_min_prob=1.0, **settings),
    )
    ours.train()
    assert all(bool((batch["sb_weight"] == 1).all()) for batch in ours.micro_batches)
    assert ours.state.global_step == reference.state.global_step == 12
    losses = [entry["loss"] for entry in ours.state.log_history if "loss" in entry]
    expected = [entry["loss"] for entry in reference.state.log_history if "loss" in entry]
    assert losses == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(weights(ours.model), weights(reference.model), atol=1e-6)


def test_default_collator_pads_and_the_queue_repads_a_text_classifier_with_label_smoothing(output_dir, tokenizer):
    trainer = SelectiveBackpropTrainer(
        model=classifier(tokenizer), processing_class=tokenizer, train_dataset=classification_data(tokenizer),
        args=make_config(output_dir, sb_strategy="sb", label_smoothing_factor=0.1, num_train_epochs=1),
    )
    assert isinstance(trainer.data_collator, DataCollatorWithPadding)
    assert trainer.per_example_loss_func.label_smoothing == 0.1
    queue = trainer.engine.queue
    assert queue.pad_values["input_ids"] == tokenizer.pad_token_id and "labels" not in queue.pad_values
    trainer.train()
    assert trainer.sb_stats["backwards"] > 0


def test_resume_with_queued_rows_of_different_lengths_reaches_the_same_weights(tmp_path):
    # Selection batches of 6 and steps of 4 x 2 leave rows of earlier batches queued at every checkpoint. A vocabulary
    # of one id per word, the same in every process: a trained WordPiece one can differ between processes
    # (huggingface/tokenizers#1794), and with it the losses, the rows kept and what is queued at step 5.
    tokenizer = word_tokenizer(sentiment_sentences()["text"])
    settings = dict(sb_strategy="sb", sb_beta=1.0, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                    sb_selection_batch_size=6, num_train_epochs=2, learning_rate=1e-3)

    def run(output_dir, resume=None, **extra):
        trainer = SelectiveBackpropTrainer(model=classifier(tokenizer), processing_class=tokenizer,
                                           train_dataset=classification_data(tokenizer),
                                           args=make_config(output_dir, **settings, **extra))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(str(tmp_path / "full"))
    partial_dir = str(tmp_path / "partial")
    run(partial_dir, save_strategy="steps", save_steps=5)
    saved = torch.load(os.path.join(partial_dir, "checkpoint-5", RANK_STATE_FILE.format(rank=0)), weights_only=False)
    assert len(saved["queue"]["rows"]["input_ids"]) > 0
    resumed = run(partial_dir, resume=os.path.join(partial_dir, "checkpoint-5"))
    assert resumed.state.global_step == full.state.global_step
    assert torch.equal(weights(resumed.model), weights(full.model))


@pytest.mark.parametrize("counted", ["all", "non_padding"])
def test_the_trainers_token_count_counts_the_tokens_trained_not_those_scored(output_dir, tokenizer, counted):
    """include_num_input_tokens_seen counts the re-padded micro-batches that are trained."""
    trainer = RecordingTrainer(
        model=classifier(tokenizer), processing_class=tokenizer, train_dataset=classification_data(tokenizer),
        args=make_config(output_dir, sb_strategy="sb", sb_keep=0.5, per_device_train_batch_size=8, num_train_epochs=1,
                         include_num_input_tokens_seen=counted),
    )
    trainer.train()
    key = "input_ids" if counted == "all" else "attention_mask"
    trained = sum(int(batch[key].numel() if counted == "all" else batch[key].sum()) for batch in trainer.micro_batches)
    assert trainer.state.num_input_tokens_seen == trained > 0
    scored = sum(len(ids) for ids in classification_data(tokenizer)["input_ids"])
    assert trained < scored
