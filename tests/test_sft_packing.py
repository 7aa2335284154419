"""Packed (padding-free) SFT with selection: per-sequence losses, re-packed training rows, resume (#33)."""

import os

import pytest

trl = pytest.importorskip("trl", reason="the SFT pair needs TRL: pip install '.[trl]'")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from sft_data import language_modelling, prompt_completion, sft_model, sft_tokenizer  # noqa: E402
from trl import SFTTrainer  # noqa: E402
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer  # noqa: E402
from hf_selective_backprop.engine import packing  # noqa: E402
from hf_selective_backprop.engine.queue import BatchQueue  # noqa: E402
from hf_selective_backprop.losses import per_example_loss_for  # noqa: E402

SETTINGS = dict(sb_strategy="sb", per_device_train_batch_size=2, num_train_epochs=2, learning_rate=1e-2, report_to=[],
                use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0, max_length=32,
                dataset_num_proc=None, packing=True)


@pytest.fixture(scope="module")
def tokenizer():
    return sft_tokenizer()


def trainer_for(output_dir, tokenizer, data, trainer_class=SelectiveBackpropSFTTrainer, **overrides):
    args = SelectiveBackpropSFTConfig(output_dir, **{**SETTINGS, **overrides})
    return trainer_class(model=sft_model(tokenizer), args=args, train_dataset=data, processing_class=tokenizer)


def assistant_turns(tokenizer) -> Dataset:
    rows = [tokenizer("review : great acting good")["input_ids"], tokenizer("review : dull bad")["input_ids"]]
    return Dataset.from_dict({"input_ids": rows * 8, "assistant_masks": [[0, 0, 0, 0, 1], [0, 0, 0, 1]] * 8})


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("data", ["language_modelling", "prompt_completion", "assistant_turns"])
def test_per_sequence_losses_average_to_trls_loss_on_the_same_packed_batch(output_dir, tokenizer, data):
    """Completion-only and assistant-only masks included: the token-weighted mean of the sequences' losses is
    SFTTrainer's loss on the packed batch, and each sequence's loss is its loss scored alone."""
    dataset = {"language_modelling": language_modelling(16), "prompt_completion": prompt_completion(16),
               "assistant_turns": assistant_turns(tokenizer)}[data]
    trainer = trainer_for(output_dir, tokenizer, dataset)
    trainer.model.eval()
    features = [trainer.train_dataset[i] for i in range(2)]
    packed = trainer.data_collator(features)  # TRL's padding-free collator, as SFTTrainer trains on it
    assert packing.is_packed(packed)
    rows = trainer._sequence_rows_collator(trainer.data_collator)(features)
    sequences = sum(len(feature["seq_lengths"]) for feature in features)
    assert rows["input_ids"].shape[0] == sequences > 2
    inputs = {key: value for key, value in rows.items() if key != "index"}
    with torch.no_grad():
        own = SFTTrainer.compute_loss(trainer, trainer.model, dict(packed))
        scored = trainer.engine.scorer(trainer.model, inputs)
        alone = trainer.model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"])
    counts = (rows["labels"][:, 1:] != -100).sum(dim=1)
    assert counts.sum() == (packed["labels"] != -100).sum()
    assert torch.allclose((scored * counts).sum() / counts.sum(), own, atol=1e-5)
    # Boundaries respected: each sequence's loss in the packed row is its loss as a padded row of its own.
    assert torch.allclose(scored, per_example_loss_for(trainer.model)(alone, rows["labels"]), atol=1e-5)
    # The ids number the dataset's sequences, in row order.
    first = packing.first_sequence_ids(trainer.train_dataset, "index")
    assert rows["index"].tolist() == list(range(first[features[0]["index"]], first[features[0]["index"]] + sequences))


def test_rows_of_kept_sequences_pack_as_trls_collator_packs_them(tokenizer, output_dir):
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(16), padding_free=True, packing=False,
                          max_length=None)
    features = [trainer.train_dataset[i] for i in range(6)]
    rows = trainer._sequence_rows_collator(trainer.data_collator)(features)
    assert rows["index"].tolist() == [feature["index"] for feature in features]
    queue = BatchQueue(**trainer._queue_padding(True, False))
    kept = torch.tensor([4, 1, 3])
    queue.push({key: value[kept] for key, value in rows.items()})
    popped = queue.pop(3)
    repacked = packing.packed_rows(popped, trainer.data_collator.pad_token_id)
    collator = DataCollatorForLanguageModeling(pad_token_id=trainer.data_collator.pad_token_id, padding_free=True)
    expected = collator([{"input_ids": features[i]["input_ids"], "labels": features[i]["labels"]} for i in kept])
    assert repacked.keys() == {*expected, "index"}
    for key, value in expected.items():
        assert torch.equal(repacked[key], value) if torch.is_tensor(value) else repacked[key] == value, key
    assert repacked["index"].tolist() == [features[i]["index"] for i in kept]
    # The collator's pad_to_multiple_of padding is not a sequence: it is stripped, then put back.
    collator.pad_to_multiple_of = 16
    padded = collator([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in features[:2]])
    split = packing.sequence_rows(padded, collator.pad_token_id)
    assert split["input_ids"].shape[0] == 2
    again = packing.packed_rows(split, collator.pad_token_id, 16)
    assert all(torch.equal(again[k], v) if torch.is_tensor(v) else again[k] == v for k, v in padded.items())


class Recording(SelectiveBackpropSFTTrainer):
    """Records the sequences the engine queues and the micro-batches it trains on."""

    def _build_engine(self):
        engine = super()._build_engine()
        self.queued, self.trained = [], []
        push = engine._push

        def recording_push(rows):
            self.queued += [ids[mask.bool()].tolist() for ids, mask in zip(rows["input_ids"], rows["attention_mask"],
                                                                                strict=True)]
            push(rows)

        engine._push = recording_push
        return engine

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        micro_batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.trained += micro_batches
        return micro_batches, num_items


@pytest.mark.parametrize("flags", [dict(), dict(padding_free=True, packing=False, max_length=None)])
def test_sb_on_packed_sft_trains_the_kept_sequences_repacked(output_dir, tokenizer, flags):
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(48), Recording, sb_strategy="sb", **flags)
    output = trainer.train()
    stats = trainer.sb_stats
    assert 0 < stats["kept"] < stats["considered"] == stats["examples_loaded"]
    assert stats["examples_loaded"] == 2 * 48  # every sequence of both epochs, though packed rows were loaded
    assert torch.isfinite(torch.tensor(output.training_loss))
    # Each training micro-batch is one padding-free row of engine.batch_size whole sequences, and together
    # they hold exactly the kept sequences, token for token, in the order they were kept.
    trained = []
    for batch in trainer.trained:
        assert packing.is_packed(batch) and batch["input_ids"].shape[0] == 1
        bounds = batch["cu_seq_lens_q"].tolist()
        assert len(bounds) - 1 == trainer.engine.batch_size
        tokens = batch["input_ids"][0]
        trained += [tokens[start:end].tolist() for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
        assert torch.equal(batch["labels"][0, bounds[:-1]], torch.full((len(bounds) - 1,), -100))
    assert len(trained) == stats["backwards"]
    assert trained == trainer.queued[:len(trained)]
    assert len(trainer.queued) - len(trained) == stats["queued_at_end"]


def test_stale_sb_on_packed_sft_resumes_exactly(tmp_path, tokenizer):
    settings = dict(sb_strategy="sb", sb_staleness=2, num_train_epochs=3)
    full = trainer_for(str(tmp_path / "full"), tokenizer, prompt_completion(), **settings)
    full.train()
    assert full.sb_stats["stale_lookups"] > 0 and full.sb_stats["kept"] < full.sb_stats["considered"]
    partial = str(tmp_path / "partial")
    trainer_for(partial, tokenizer, prompt_completion(), save_strategy="steps", save_steps=2, **settings).train()
    resumed = trainer_for(partial, tokenizer, prompt_completion(), save_strategy="steps", save_steps=2, **settings)
    resumed.train(resume_from_checkpoint=os.path.join(partial, "checkpoint-2"))
    assert resumed.state.global_step == full.state.global_step
    assert torch.equal(weights(resumed.model), weights(full.model))


@pytest.mark.parametrize("flags, match", [
    (dict(sb_strategy="uniform"), "decides before loading.*packed row holds several sequences"),
    (dict(sb_strategy="infobatch"), "decides before loading.*packed row holds several sequences"),
    (dict(sb_strategy="rholoss", sb_reference_column="ref"), "reference pass scores dataset rows"),
])
def test_strategies_that_cannot_select_sequences_of_packed_rows_are_refused(output_dir, tokenizer, flags, match):
    with pytest.raises(ValueError, match=match):
        trainer_for(output_dir, tokenizer, prompt_completion(8), **flags)


def test_a_per_example_loss_of_ones_own_is_refused_on_packed_rows(output_dir, tokenizer):
    args = SelectiveBackpropSFTConfig(output_dir, **{**SETTINGS, "sb_strategy": "sb"})
    with pytest.raises(ValueError, match="per_example_loss_func with packing=True"):
        SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args, train_dataset=prompt_completion(8),
                                    processing_class=tokenizer, per_example_loss_func=lambda outputs, labels: None)


@pytest.mark.parametrize("strategy", ["infobatch", "uniform"])
def test_padding_free_sft_plans_sequences_before_loading(output_dir, tokenizer, strategy):
    """padding_free=True alone: a dataset row is one sequence with its own id, so plans skip loading sequences."""
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(48), Recording, sb_strategy=strategy,
                          padding_free=True, packing=False, max_length=None, num_train_epochs=3)
    output = trainer.train()
    stats = trainer.sb_stats
    assert stats["examples_loaded"] == stats["kept"] < stats["considered"] == 3 * 48
    assert stats["selection_forwards"] == 0 and torch.isfinite(torch.tensor(output.training_loss))
    assert all(packing.is_packed(batch) for batch in trainer.trained)
