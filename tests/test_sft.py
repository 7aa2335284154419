"""TRL's SFTTrainer + selection: masks, packing, exact equality with SFTTrainer, resume, two processes."""

import json
import os
import runpy
import sys
import warnings
from pathlib import Path

import pytest

trl = pytest.importorskip("trl", reason="the SFT pair needs TRL: pip install '.[trl]'")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from huggingface_hub import ModelCard  # noqa: E402
from launch import watched  # noqa: E402
from sft_data import language_modelling, prompt_completion, sft_model, sft_tokenizer  # noqa: E402
from text_tiny import rholoss_reference  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer  # noqa: E402
from hf_selective_backprop.data.text import label_completions  # noqa: E402
from hf_selective_backprop.losses import per_example_loss_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-2, report_to=[], use_cpu=True,
                bf16=False, save_strategy="no", disable_tqdm=True, seed=0, max_length=32, dataset_num_proc=None)


@pytest.fixture(scope="module")
def tokenizer():
    return sft_tokenizer()


def config(output_dir, config_class=SelectiveBackpropSFTConfig, **overrides):
    """TRL's SFTConfig, or the selective one with Selective-Backprop itself unless ``overrides`` name a strategy."""
    selective = {"sb_strategy": "sb"} if config_class is SelectiveBackpropSFTConfig else {}
    return config_class(output_dir, **{**SETTINGS, **selective, **overrides})


def trainer_for(output_dir, tokenizer, data, trainer_class=SelectiveBackpropSFTTrainer, **overrides):
    config_class = SFTConfig if trainer_class is SFTTrainer else SelectiveBackpropSFTConfig
    return trainer_class(model=sft_model(tokenizer), args=config(output_dir, config_class, **overrides),
                         train_dataset=data, processing_class=tokenizer)


def weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("flag", ["packing", "padding_free"])
def test_packing_and_padding_free_are_accepted_with_selection(output_dir, flag):
    # Selection keeps or drops the sequences of packed rows (tests/test_sft_packing.py).
    assert getattr(config(output_dir, **{flag: True}), flag)
    assert getattr(config(output_dir, sb_strategy="none", **{flag: True}), flag)


@pytest.mark.parametrize("data, overrides", [
    (language_modelling, dict(sb_strategy="sb")),
    (prompt_completion, dict(sb_strategy="sb", sb_staleness=2, num_train_epochs=3)),
    (prompt_completion, dict(sb_strategy="sb", sb_importance_weighting=True, gradient_accumulation_steps=2)),
])
def test_selection_trains_sft_without_a_second_forward(output_dir, tokenizer, data, overrides):
    trainer = trainer_for(output_dir, tokenizer, data(), **overrides)
    with warnings.catch_warnings():
        # Asked for outputs, SFTTrainer warns that it runs a second forward for the logits.
        warnings.filterwarnings("error", message=".*return_outputs=True.*", category=FutureWarning)
        trainer.train()
    stats = trainer.sb_stats
    assert 0 < stats["backwards"] < stats["examples_seen"]
    if overrides.get("sb_staleness"):
        assert stats["stale_lookups"] > 0
    # TRL's own metrics still reach the log.
    assert any("mean_token_accuracy" in entry for entry in trainer.state.log_history)


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_per_example_loss_is_trls_loss_over_completion_tokens_only(output_dir, tokenizer, loss_type):
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(8), loss_type=loss_type)
    assert trainer.completion_only_loss
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    labels = batch["labels"]
    inputs = {key: value for key, value in batch.items() if key != "index"}
    trainer.model.eval()
    with torch.no_grad():
        own = SFTTrainer.compute_loss(trainer, trainer.model, dict(inputs))
        scored = trainer.engine.scorer(trainer.model, inputs)
        logits = trainer.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    counts = (labels[:, 1:] != -100).sum(dim=1)
    # The prompt is -100 in the labels: only the completion (" good" or " bad", then EOS) is scored.
    assert torch.equal(counts, torch.full((8,), 2))
    assert torch.allclose((scored * counts).sum() / counts.sum(), own, atol=1e-6)
    # The same as transformers' causal-LM loss of each example on the full logits (DFT: times each token's probability).
    tokens = torch.nn.functional.cross_entropy(logits.logits[:, :-1].transpose(1, 2), labels[:, 1:], reduction="none")
    if loss_type == "dft":
        tokens = tokens * torch.exp(-tokens)
    assert torch.allclose(scored, tokens.sum(1) / counts, atol=1e-5)
    if loss_type == "nll":
        assert torch.allclose(scored, per_example_loss_for(trainer.model)(logits, labels), atol=1e-5)


@pytest.mark.cpu_kernels
def test_none_is_exactly_sft_trainer(output_dir, tokenizer):
    reference = trainer_for(output_dir, tokenizer, prompt_completion(), SFTTrainer)
    reference.train()
    ours = trainer_for(output_dir, tokenizer, prompt_completion(), sb_strategy="none")
    ours.train()
    assert ours.state.global_step == reference.state.global_step
    assert torch.equal(weights(ours.model), weights(reference.model))


def test_resume_reaches_the_uninterrupted_weights(tmp_path, tokenizer):
    settings = dict(sb_strategy="sb", sb_staleness=2, num_train_epochs=3, sb_selection_batch_size=6)
    full = trainer_for(str(tmp_path / "full"), tokenizer, prompt_completion(), **settings)
    full.train()
    partial = str(tmp_path / "partial")
    trainer_for(partial, tokenizer, prompt_completion(), save_strategy="steps", save_steps=4, **settings).train()
    resumed = trainer_for(partial, tokenizer, prompt_completion(), save_strategy="steps", save_steps=4, **settings)
    resumed.train(resume_from_checkpoint=os.path.join(partial, "checkpoint-4"))
    assert resumed.state.global_step == full.state.global_step
    assert torch.equal(weights(resumed.model), weights(full.model))
    card = (Path(partial) / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "- sft" in card and "- trl" in card


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_two_processes_select_in_lockstep(tmp_path, layout):
    """Padded rows, and packed ones: a packed row holds a varying number of sequences, so the two ranks' selection
    batches can hold different numbers of sequences, and the ranks must still take the same optimizer steps."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "tests" / "sft_worker.py"), str(tmp_path), *(["--packing"] if layout == "packed" else [])]
    code, output = watched(command)
    assert code == 0, output[-6000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert torch.equal(ranks[0]["weights"], ranks[1]["weights"])
    assert ranks[0]["backwards"] == ranks[1]["backwards"] > 0
    assert ranks[0]["stale_lookups"] > 0


def test_the_sft_script_trains_offline_and_writes_model_tokenizer_and_card(review_folder, tmp_path, monkeypatch):
    out = tmp_path / "sft"
    monkeypatch.setattr(sys, "argv", [
        "train_sft.py", "--dataset", str(review_folder), "--text_column", "review", "--sb_strategy", "sb",
        "--sb_keep", "0.5", "--vocab_size", "60", "--num_layers", "1", "--hidden_size", "16", "--num_heads", "2",
        "--intermediate_size", "32", "--max_length", "16", "--per_device_train_batch_size", "16",
        "--use_cpu", "--disable_tqdm", "true", "--dataset_num_proc", "1", "--output_dir", str(out),
    ])
    runpy.run_path(str(ROOT / "scripts" / "train_sft.py"), run_name="__main__")
    stats = json.loads((out / "sb_stats.json").read_text())
    assert stats["selection_forwards"] == 96 and 0 < stats["backwards"] < 96
    evaluation = json.loads((out / "eval_results.json").read_text())
    assert "eval_perplexity" in evaluation
    training = json.loads((out / "train_results.json").read_text())
    assert training["train_tokens_per_epoch"] > 0 and training["train_samples"] > 0
    assert json.loads((out / "all_results.json").read_text()) == {**training, **evaluation}
    state = json.loads((out / "trainer_state.json").read_text())  # as the Hugging Face example scripts end
    assert state["global_step"] == stats["optimizer_steps"] > 0
    assert any("train_runtime" in entry for entry in state["log_history"])
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text-generation" and {"trl", "sft"} <= set(card.data.tags)
    tokenizer = AutoTokenizer.from_pretrained(out)
    # The script's tokenizer opens a text with [CLS]; SFTTrainer closes it with the end-of-text token.
    assert tokenizer("great acting")["input_ids"][0] == tokenizer.cls_token_id
    assert AutoModelForCausalLM.from_pretrained(out).config.n_layer == 1


def test_the_sft_script_trains_label_completions_scored_on_the_answer_alone(review_folder, tmp_path, monkeypatch):
    out = tmp_path / "sft"
    monkeypatch.setattr(sys, "argv", [
        "train_sft.py", "--dataset", str(review_folder), "--text_column", "review", "--label_column", "sentiment",
        "--completion_from_label", "true", "--sb_strategy", "sb", "--sb_keep", "0.5", "--vocab_size", "60",
        "--num_layers", "1", "--hidden_size", "16", "--num_heads", "2", "--intermediate_size", "32",
        "--max_length", "64", "--per_device_train_batch_size", "16", "--use_cpu", "--disable_tqdm", "true",
        "--dataset_num_proc", "1", "--output_dir", str(out),
    ])
    runpy.run_path(str(ROOT / "scripts" / "train_sft.py"), run_name="__main__")
    stats = json.loads((out / "sb_stats.json").read_text())
    assert stats["selection_forwards"] == 96 and 0 < stats["backwards"] < 96
    assert 0.0 <= json.loads((out / "eval_results.json").read_text())["eval_mean_token_accuracy"] <= 1.0


@pytest.mark.parametrize("label_column, message", [
    # The text as its own label: every text its own class, and the completion repeated the prompt, silently.
    ("review", r"^--label_column 'review' is the text column: the labels must be a column of their own \(here: id, "
               r"sentiment, tags\)"),
    # A column of lists: a raw error from datasets' unique().
    ("tags", r"^--label_column 'tags' holds list values: text-classification needs class labels, integers 0..K-1, "
             r"strings or a ClassLabel"),
])
def test_completions_from_a_column_that_holds_no_labels_are_refused_naming_it(tmp_path, label_column, message):
    from text_tiny import NEGATIVE, POSITIVE

    folder = tmp_path / "tagged"
    folder.mkdir()
    rows = [{"id": i, "review": text, "sentiment": "pos" if text in POSITIVE else "neg", "tags": text.split()[:2]}
            for i, text in enumerate(POSITIVE + NEGATIVE)]
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows * 4))
    with pytest.raises(ValueError, match=message):
        _sft_script(folder, tmp_path / "sft", "--completion_from_label", "true", "--label_column", label_column)
    assert not (tmp_path / "sft" / "tokenizer.json").exists()


@pytest.mark.parametrize("strategy", ["sb", "none"])
def test_a_max_length_below_one_is_refused_when_the_config_is_built(output_dir, strategy):
    # SFTConfig takes --max_length 0, which no text fits: train_sft.py read the data and learnt a tokenizer first.
    with pytest.raises(ValueError, match=r"^--max_length must be >= 1 \(or None: no truncation\), got 0"):
        config(output_dir, max_length=0, sb_strategy=strategy)


def test_label_completions_pair_each_text_with_its_label_name_and_refuse_unlabelled_rows():
    rows = Dataset.from_dict({"sentence": ["fine film", "dull", "?"], "label": [1, 0, -1], "idx": [0, 1, 2]})
    pairs = label_completions(rows.select([0, 1]), "sentence", "label", ["negative", "positive"])
    assert pairs.column_names == ["prompt", "completion"]
    assert pairs["prompt"] == ["fine film sentiment :", "dull sentiment :"]
    assert pairs["completion"] == [" positive", " negative"]
    with pytest.raises(ValueError, match=r"label column 'label': rows 2 have no label in 0..1"):
        label_completions(rows, "sentence", "label", ["negative", "positive"])


def test_assistant_masks_leave_only_assistant_tokens_in_each_examples_loss(output_dir, tokenizer):
    """A tokenized conversation's assistant_masks (as TRL's chat templates return them) set the labels."""
    rows = [tokenizer("review : great acting good")["input_ids"], tokenizer("review : dull bad")["input_ids"]]
    masks = [[0, 0, 0, 0, 1], [0, 0, 0, 1]]
    data = Dataset.from_dict({"input_ids": rows * 4, "assistant_masks": masks * 4})
    trainer = trainer_for(output_dir, tokenizer, data)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    inputs = {key: value for key, value in batch.items() if key != "index"}
    with torch.no_grad():
        own = SFTTrainer.compute_loss(trainer, trainer.model, dict(inputs))
        scored = trainer.engine.scorer(trainer.model, inputs)
        logits = trainer.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    # One assistant token per conversation: its loss is the next-token loss of that token alone.
    for row, position in ((0, 4), (1, 3)):
        token = inputs["input_ids"][row, position]
        expected = torch.nn.functional.cross_entropy(logits[row, position - 1], token)
        assert torch.allclose(scored[row], expected, atol=1e-5)
    assert torch.allclose(scored.mean(), own, atol=1e-6)


def test_weights_of_one_train_exactly_as_sft_trainer_with_accumulation(output_dir, tokenizer):
    """sb keeping every row with weight 1 (P = 1): the weighted loss is SFTTrainer's own."""
    settings = dict(gradient_accumulation_steps=2, lr_scheduler_type="constant", logging_steps=1, num_train_epochs=1)
    reference = trainer_for(output_dir, tokenizer, prompt_completion(32), SFTTrainer, **settings)
    reference.train()
    ours = trainer_for(output_dir, tokenizer, prompt_completion(32), sb_importance_weighting=True, sb_min_prob=1.0,
                       **settings)
    ours.train()
    assert ours.state.global_step == reference.state.global_step == 4
    losses = [entry["loss"] for entry in ours.state.log_history if "loss" in entry]
    expected = [entry["loss"] for entry in reference.state.log_history if "loss" in entry]
    assert losses == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(weights(ours.model), weights(reference.model), atol=1e-6)


def test_other_arguments_are_refused_naming_the_sft_config(output_dir, tokenizer):
    from hf_selective_backprop import SelectiveBackpropConfig

    for args in (SelectiveBackpropConfig(output_dir, use_cpu=True), SFTConfig(output_dir, use_cpu=True, bf16=False)):
        message = f"needs args of type SelectiveBackpropSFTConfig.*got {type(args).__name__}"
        with pytest.raises(TypeError, match=message):
            SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args, train_dataset=language_modelling(),
                                        processing_class=tokenizer)


@pytest.mark.parametrize("given_as", ["reference_model", "--sb_reference_model"])
def test_rholoss_with_a_reference_model_trains_through_the_sft_pair(tmp_path, tokenizer, given_as):
    # The reference pass collates with TRL's collator, which drops the id column the table is keyed by.
    reference = sft_model(tokenizer, seed=1)
    data = prompt_completion(24)
    overrides, kwargs = rholoss_reference(given_as, reference, tmp_path / "reference")
    trainer = SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=config(str(tmp_path / "out"), **overrides),
                                          train_dataset=data, processing_class=tokenizer, **kwargs)
    trainer.train()
    stats = trainer.sb_stats
    assert stats["reference_forwards"] == len(data)
    assert 0 < stats["backwards"] < stats["examples_seen"]


def _sft_script(review_folder, out, *extra):
    argv = ["train_sft.py", "--dataset", str(review_folder), "--text_column", "review", "--vocab_size", "60",
            "--num_layers", "1", "--hidden_size", "16", "--num_heads", "2", "--intermediate_size", "32",
            "--max_length", "16", "--per_device_train_batch_size", "16", "--use_cpu", "--disable_tqdm", "true",
            "--dataset_num_proc", "1", "--eval_split", "none", "--eval_strategy", "no", "--output_dir", str(out),
            *extra]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(ROOT / "scripts" / "train_sft.py"), run_name="__main__")
    finally:
        sys.argv = old


def test_the_sft_script_refuses_a_finished_runs_folder(review_folder, tmp_path):
    out = tmp_path / "sft"
    _sft_script(review_folder, out, "--sb_strategy", "none")
    written = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    with pytest.raises(ValueError, match="already holds a finished run .*--overwrite_output_dir"):
        _sft_script(review_folder, out, "--sb_strategy", "none")
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == written


@pytest.mark.parametrize("strategy", ["none", "sb"])
def test_the_sft_script_resumes_with_its_checkpoints_tokenizer_exactly(review_folder, tmp_path, strategy):
    out = tmp_path / "sft"
    run = ("--sb_strategy", strategy, "--sb_keep", "0.5", "--num_train_epochs", "2", "--save_total_limit", "2")
    _sft_script(review_folder, out, *run)
    uninterrupted = AutoModelForCausalLM.from_pretrained(out).state_dict()
    first = min(out.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    _sft_script(review_folder, out, *run, "--resume_from_checkpoint", str(first))
    resumed = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("strategy", ["sb", "none"])
@pytest.mark.parametrize("flag, value", [("--vocab_size", "80"), ("--num_layers", "2")])
def test_the_sft_script_refuses_a_resume_with_another_model_flag(review_folder, tmp_path, flag, value, strategy):
    # The resumed run reuses the checkpoint's tokenizer: another --vocab_size was ignored without a word,
    # another --num_layers failed on the weights after the data was loaded; without selection, until the run
    # recorded its flags in trainer_state.json, both still did.
    out = tmp_path / "sft"
    run = ("--sb_strategy", strategy, "--sb_keep", "0.5", "--save_total_limit", "1")
    _sft_script(review_folder, out, *run)
    last = next(out.glob("checkpoint-*"))
    saved = {"--vocab_size": 60, "--num_layers": 1}[flag]
    with pytest.raises(ValueError, match=rf"model flags differ from the saved run's:\n  {flag}: saved {saved}, "
                       rf"now {value}\n"):
        _sft_script(review_folder, out, *run, "--resume_from_checkpoint", str(last), flag, value)


def test_the_sft_card_heads_its_results_with_the_runs_own_metric_and_names_trl(output_dir, tokenizer):
    import trl

    trainer = SelectiveBackpropSFTTrainer(
        model=sft_model(tokenizer), args=config(output_dir, eval_strategy="epoch", num_train_epochs=1),
        train_dataset=prompt_completion(16), eval_dataset=prompt_completion(8), processing_class=tokenizer,
    )
    trainer.train()
    text = Path(trainer.create_model_card()).read_text()
    token_accuracy = [e["eval_mean_token_accuracy"] for e in trainer.state.log_history
                      if "eval_mean_token_accuracy" in e][-1]
    assert f"| mean token accuracy (evaluation set) | {100 * token_accuracy:.2f} % |" in text
    assert "| accuracy (" not in text and f"TRL {trl.__version__}" in text


def test_the_sft_script_refuses_a_classifier_naming_the_flag_and_what_it_needs(review_folder, tmp_path, monkeypatch):
    # AutoModelForCausalLM loaded a BERT classifier as BertLMHeadModel, and the run failed mid-training.
    from text_tiny import sequence_classifier

    import hf_selective_backprop.data.text as text_data

    monkeypatch.setattr(text_data, "load_text_data", lambda *args, **kwargs: pytest.fail("the data was read"))
    folder = tmp_path / "bert"
    sequence_classifier().save_pretrained(folder)
    with pytest.raises(ValueError, match=rf"^--model_name_or_path '{folder}' is a text classifier "
                       r"\(BertForSequenceClassification\): scripts/train_sft.py needs a causal language model"):
        _sft_script(review_folder, tmp_path / "sft", "--model_name_or_path", str(folder))
    assert not (tmp_path / "sft").exists()


def test_the_sft_script_fits_max_length_to_the_models_positions(review_folder, tmp_path, caplog):
    # Its own 16-position GPT-2 fine-tuned with --max_length 64: rows indexed past the position embeddings (a raw
    # IndexError); scripts/train_text.py fitted --max_length already.
    _sft_script(review_folder, tmp_path / "small", "--sb_strategy", "none", "--save_strategy", "no")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "small").config.n_positions == 16
    with caplog.at_level("WARNING", logger="hf_selective_backprop.text_models"):
        _sft_script(review_folder, tmp_path / "tuned", "--model_name_or_path", str(tmp_path / "small"),
                    "--max_length", "64", "--save_strategy", "no")
    assert "--max_length 64 is longer than the model takes" in caplog.text
    assert json.loads((tmp_path / "tuned" / "sb_stats.json").read_text())["backwards"] > 0


def _bf16_hardware() -> bool:
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def test_without_arguments_the_sft_pair_makes_trls_default_and_trains_on_a_cpu(tmp_path, monkeypatch, tokenizer):
    """SFTTrainer(model) makes SFTConfig("<model>-SFT"), whose bf16=True stopped a CPU run ("You need to assign
    use_cpu"); the pair makes the same with the sb_* fields and bf16 only where the hardware has it."""
    monkeypatch.chdir(tmp_path)
    trainer = SelectiveBackpropSFTTrainer(sft_model(tokenizer), train_dataset=prompt_completion(16),
                                          processing_class=tokenizer)
    args = trainer.args
    assert isinstance(args, SelectiveBackpropSFTConfig) and args.output_dir.endswith("-SFT")
    assert args.bf16 == (_bf16_hardware() and not args.use_cpu)
    trainer.train()
    assert trainer.sb_stats["optimizer_steps"] == trainer.state.global_step > 0


@pytest.mark.skipif(_bf16_hardware(), reason="this machine has bfloat16 hardware: --bf16 is accepted")
def test_bf16_asked_for_on_a_cpu_says_exactly_what_to_set(output_dir):
    with pytest.raises(ValueError, match=r"--bf16 needs a GPU .*leave --bf16 unset \(or pass --bf16 false\).*"
                                         r"--use_cpu"):
        SelectiveBackpropSFTConfig(output_dir, bf16=True)
    assert SelectiveBackpropSFTConfig(output_dir, bf16=True, use_cpu=True).bf16  # bf16 autocast on the CPU, as asked


def test_the_card_of_the_last_checkpoint_holds_the_runs_costs(output_dir, tokenizer):
    """SFTTrainer writes the model card at every checkpoint, during training: the last one, at the run's end,
    holds what the run cost (it read n/a in every cost row)."""
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(), save_strategy="epoch")
    trainer.train()
    text = (Path(output_dir) / "README.md").read_text()
    stats = trainer.sb_stats
    assert f"| backward passes (examples) | {stats['backwards']:,} |" in text
    assert f"| selection forwards (examples) | {stats['selection_forwards']:,} |" in text
    assert f"| optimizer steps | {stats['optimizer_steps']:,} |" in text
    assert f"| kept rows left untrained when the run ended | {stats['queued_at_end']:,} |" in text


def test_the_card_of_a_plain_runs_last_checkpoint_counts_its_full_passes(output_dir, tokenizer):
    trainer = trainer_for(output_dir, tokenizer, prompt_completion(), sb_strategy="none", save_strategy="epoch")
    trainer.train()
    text = (Path(output_dir) / "README.md").read_text()
    rows = trainer.args.num_train_epochs * len(trainer.train_dataset)
    assert f"| backward passes (examples) | {rows:,} |" in text
    assert f"| optimizer steps | {trainer.state.global_step:,} |" in text
