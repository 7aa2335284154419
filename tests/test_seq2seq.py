"""Seq2SeqTrainer + selection: encoder-decoder LMs (T5, BART) with DataCollatorForSeq2Seq."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from text_tiny import NEGATIVE, POSITIVE, rholoss_reference, tiny_bart, tiny_t5, word_tokenizer
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_selective_backprop import SelectiveBackpropSeq2SeqConfig, SelectiveBackpropSeq2SeqTrainer
from hf_selective_backprop.engine.checkpoints import RANK_STATE_FILE

TEXTS = POSITIVE + NEGATIVE
MODELS = {"t5": tiny_t5, "bart": tiny_bart}
SETTINGS = dict(per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-2, report_to=[], use_cpu=True,
                save_strategy="no", disable_tqdm=True, seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer(TEXTS)


def reversal_data(tokenizer, n: int = 32) -> Dataset:
    """Sentences and their words reversed and cut to 1-4 words: targets of other lengths than sources."""
    sources = [TEXTS[i % len(TEXTS)] for i in range(n)]
    targets = [" ".join(list(reversed(text.split()))[: 1 + i % 4]) for i, text in enumerate(sources)]
    return Dataset.from_dict(dict(tokenizer(sources, text_target=targets)))


class RecordingTrainer(SelectiveBackpropSeq2SeqTrainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro_batches = getattr(self, "micro_batches", [])
        self.micro_batches.append({key: value.clone() for key, value in inputs.items()})
        return super().training_step(model, inputs, num_items_in_batch)


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("name", ["t5", "bart"])
@pytest.mark.parametrize("staleness", [1, 2])
def test_selection_trains_encoder_decoder_models_on_repadded_targets(output_dir, tokenizer, name, staleness):
    model = MODELS[name](tokenizer)
    trainer = RecordingTrainer(
        model=model, processing_class=tokenizer, train_dataset=reversal_data(tokenizer),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        args=SelectiveBackpropSeq2SeqConfig(output_dir, sb_strategy="sb", sb_staleness=staleness,
                                            sb_selection_batch_size=8, label_smoothing_factor=0.1, **SETTINGS),
    )
    trainer.train()
    stats = trainer.sb_stats
    assert stats["backwards"] == 4 * stats["optimizer_steps"] > 0
    assert stats["stale_lookups"] > 0 if staleness > 1 else stats["selection_forwards"] == 64
    for batch in trainer.micro_batches:
        labels, decoder_inputs = batch["labels"], batch["decoder_input_ids"]
        # Targets keep a length of their own, the longest kept one's; sources the longest kept source's.
        assert labels.shape == decoder_inputs.shape and labels.shape[1] == int((labels != -100).sum(1).max())
        assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max())
        # Wherever a label is scored, the decoder reads the labels shifted right, as the collator made them
        # (past a row's last label the causal decoder's inputs change nothing scored).
        scored = labels != -100
        expected = model.prepare_decoder_input_ids_from_labels(labels=labels)
        assert torch.equal(decoder_inputs[scored], expected[scored])
    assert len({batch["labels"].shape[1] for batch in trainer.micro_batches}) > 1


@pytest.mark.cpu_kernels
def test_none_is_exactly_seq2seq_trainer(output_dir, tokenizer):
    def run(trainer_class, args_class, **extra):
        model = tiny_t5(tokenizer)
        trainer = trainer_class(model=model, args=args_class(output_dir, **SETTINGS, **extra),
                                train_dataset=reversal_data(tokenizer), processing_class=tokenizer,
                                data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
        trainer.train()
        return trainer

    reference = run(Seq2SeqTrainer, Seq2SeqTrainingArguments)
    ours = run(SelectiveBackpropSeq2SeqTrainer, SelectiveBackpropSeq2SeqConfig, sb_strategy="none")
    assert ours.state.global_step == reference.state.global_step
    assert torch.equal(weights(ours.model), weights(reference.model))
    ours.create_model_card()
    card = (Path(output_dir) / "README.md").read_text()
    assert "pipeline_tag: text2text-generation" in card and "- selective-backprop" in card


def test_resume_with_queued_targets_of_different_lengths_reaches_the_same_weights(tmp_path, tokenizer):
    # Selection batches of 6 and steps of 4 leave rows of earlier batches queued at the checkpoint.
    settings = dict(SETTINGS, sb_strategy="sb", sb_staleness=2, sb_selection_batch_size=6, num_train_epochs=3)

    def run(output_dir, resume=None, **extra):
        model = tiny_t5(tokenizer)
        trainer = SelectiveBackpropSeq2SeqTrainer(
            model=model, args=SelectiveBackpropSeq2SeqConfig(output_dir, **{**settings, **extra}),
            train_dataset=reversal_data(tokenizer), processing_class=tokenizer,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(str(tmp_path / "full"))
    partial = str(tmp_path / "partial")
    run(partial, save_strategy="steps", save_steps=3)
    saved = torch.load(Path(partial) / "checkpoint-3" / RANK_STATE_FILE.format(rank=0), weights_only=False)
    assert len(saved["queue"]["rows"]["labels"]) > 0
    resumed = run(partial, str(Path(partial) / "checkpoint-3"), save_strategy="steps", save_steps=3)
    assert resumed.state.global_step == full.state.global_step
    assert torch.equal(weights(resumed.model), weights(full.model))


@pytest.mark.parametrize("given_as", ["reference_model", "--sb_reference_model"])
def test_rholoss_with_a_reference_model_trains_through_the_seq2seq_pair(tmp_path, tokenizer, given_as):
    model, reference = tiny_t5(tokenizer), tiny_t5(tokenizer)
    data = reversal_data(tokenizer)
    overrides, kwargs = rholoss_reference(given_as, reference, tmp_path / "reference")
    trainer = SelectiveBackpropSeq2SeqTrainer(
        model=model, processing_class=tokenizer, train_dataset=data,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        args=SelectiveBackpropSeq2SeqConfig(str(tmp_path / "out"), **overrides, **SETTINGS), **kwargs,
    )
    trainer.train()
    stats = trainer.sb_stats
    assert stats["reference_forwards"] == len(data)
    assert 0 < stats["backwards"] < stats["examples_seen"]
