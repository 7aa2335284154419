"""PEFT adapter models (LoRA): the loss, padding and per-example loss come from the base model's head."""

import pytest
import torch

pytest.importorskip("peft", reason="the adapter tests need PEFT: pip install '.[dev]'")
pytest.importorskip("trl", reason="the SFT pair needs TRL: pip install '.[trl]'")

from peft import LoraConfig, get_peft_model  # noqa: E402
from sft_data import language_modelling, prompt_completion, sft_model, sft_tokenizer  # noqa: E402
from tiny import make_config  # noqa: E402
from transformers import DataCollatorForLanguageModeling  # noqa: E402

from hf_selective_backprop import (  # noqa: E402
    SelectiveBackpropSFTConfig,
    SelectiveBackpropSFTTrainer,
    SelectiveBackpropTrainer,
)
from hf_selective_backprop.losses import model_task, recognized_head  # noqa: E402

LORA = dict(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM")


@pytest.fixture(scope="module")
def tokenizer():
    return sft_tokenizer()


def frozen_and_adapter(model) -> tuple[dict, dict]:
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    adapter = {name: p for name, p in params.items() if "lora_" in name}
    return {name: p for name, p in params.items() if name not in adapter}, adapter


def test_a_peft_model_is_read_by_its_base_models_head(tokenizer):
    model = get_peft_model(sft_model(tokenizer), LoraConfig(**LORA))
    assert type(model).__name__ == "PeftModelForCausalLM"
    assert model_task(model) == "causal-lm" and recognized_head(model)


def test_sft_with_a_lora_adapter_selects_sequences_and_trains_only_the_adapter(output_dir, tokenizer):
    """SFTTrainer(peft_config=...) wraps the model: the queue must re-pad the token labels as a causal LM's (they
    were taken for one label per row, and the training forward failed on labels one column longer)."""
    args = SelectiveBackpropSFTConfig(output_dir, per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-2,
                                      report_to=[], use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True,
                                      seed=0, max_length=32, sb_strategy="sb", sb_keep=0.5)
    trainer = SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args, train_dataset=prompt_completion(64),
                                          processing_class=tokenizer, peft_config=LoraConfig(**LORA))
    frozen, adapter = frozen_and_adapter(trainer.model)
    assert adapter
    trainer.train()
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 2 * 64 and 0 < stats["backwards"] < stats["selection_forwards"]
    frozen_after, adapter_after = frozen_and_adapter(trainer.model)
    assert all(torch.equal(frozen[name], frozen_after[name]) for name in frozen)
    assert any(not torch.equal(adapter[name], adapter_after[name]) for name in adapter)


def test_the_trainer_scores_a_lora_language_model_with_its_token_loss(output_dir, tokenizer):
    """The plain trainer on a PEFT causal LM: the construction check compares the automatic per-example loss
    with the model's own, and the kept rows train."""
    data = language_modelling(32).map(lambda row: tokenizer(row["text"]), remove_columns=["text"])
    model = get_peft_model(sft_model(tokenizer), LoraConfig(**LORA))
    trainer = SelectiveBackpropTrainer(
        model=model, args=make_config(output_dir, sb_keep=0.5, num_train_epochs=1, per_device_train_batch_size=4),
        train_dataset=data, data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
    )
    assert trainer.per_example_loss_func.task == "causal-lm"
    trainer.train()
    assert 0 < trainer.sb_stats["backwards"] < trainer.sb_stats["selection_forwards"] == 32
