"""The example record: its statistics, the trainer's feeds for every strategy and trainer pair, resume, the table
and data map it writes, the Hub upload, and the API that reads it (label issues, pruning, --sb_subset_from)."""

import math
import os
from pathlib import Path

import launch
import numpy
import pytest
import torch
from datasets import Dataset, IterableDataset, load_dataset
from PIL import Image
from tiny import TinyClassifier, make_config, make_dataset
from transformers import Trainer

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer, record
from hf_selective_backprop.data.noise import flip_labels
from hf_selective_backprop.record.files import record_metadata
from hf_selective_backprop.record.keeper import RECORD_STATE_FILE
from hf_selective_backprop.record.pruning import kept_ids
from hf_selective_backprop.record.table import SCORED, TRAINED, ExampleRecord

STRATEGIES = dict(
    none={}, sb={}, stale_sb=dict(sb_strategy="sb", sb_staleness=2), topk={}, composer=dict(sb_keep=0.5),
    kath18={}, uniform={}, infobatch={}, early_prune=dict(sb_keep=0.5), early_coverage=dict(sb_keep=0.5),
    early_random=dict(sb_keep=0.5), early_class_budget=dict(sb_keep=0.5),
)


def _events(record_, *rows):
    """Apply (id, loss, kind, epoch) or (id, loss, kind, epoch, margin) rows in order."""
    ids, losses, kinds, epochs, *margins = (torch.tensor(column) for column in zip(*rows, strict=True))
    record_.apply(ids.long(), losses.double(), kinds.long(), epochs.long(),
                  margins[0].double() if margins else None)


def _trained(output_dir, strategy, **overrides):
    settings = STRATEGIES[strategy]
    args = make_config(output_dir, **{"sb_strategy": strategy, **settings, **overrides})
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset())
    trainer.train()
    return trainer


def _weights(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ---- the statistics ---------------------------------------------------------------------------------------------

def test_a_training_forward_after_a_selection_forward_of_the_same_epoch_counts_a_backward_not_a_scoring():
    table = ExampleRecord()
    _events(table, (3, 0.9, SCORED, 0), (3, 0.8, TRAINED, 0),  # scored and kept: one scoring, one backward
            (5, 0.4, TRAINED, 0),  # planned (no selection forward): the training forward scores it
            (7, 1.2, SCORED, 0), (7, 0.3, TRAINED, 1))  # scored, then trained in the next epoch: two scorings
    assert table["times_scored"][[3, 5, 7]].tolist() == [1, 1, 2]
    assert table["times_backpropagated"][[3, 5, 7]].tolist() == [1, 1, 1]
    assert table["last_loss"][3].item() == pytest.approx(0.9) and table["last_loss"][7].item() == pytest.approx(0.3)
    assert record.record_dataset(table)["id"] == [3, 5, 7]  # only what training saw


def test_confidence_variability_forgetting_and_first_learned_follow_the_losses():
    table = ExampleRecord()
    losses = [2.0, 0.1, 1.5, 0.2]  # learned at epoch 1, forgotten at 2, learned again at 3
    _events(table, *[(0, loss, TRAINED, epoch) for epoch, loss in enumerate(losses)])
    (row,) = record.record_dataset(table).to_list()
    confidences = numpy.exp(-numpy.array(losses))
    assert row["confidence"] == pytest.approx(confidences.mean(), rel=1e-6)
    assert row["variability"] == pytest.approx(confidences.std(), rel=1e-5)
    assert row["mean_loss"] == pytest.approx(numpy.mean(losses), rel=1e-6)
    assert row["correctness"] == pytest.approx(0.5)
    assert (row["forgetting_events"], row["first_learned_epoch"], row["first_loss"]) == (1, 1, pytest.approx(2.0))


def test_aum_is_the_mean_margin_of_the_scorings_that_gave_one():
    table = ExampleRecord()
    nan = float("nan")
    _events(table, (0, 0.9, SCORED, 0, 1.5), (0, 0.8, TRAINED, 0, 9.0),  # the training forward is no new scoring
            (0, 0.3, TRAINED, 1, -0.5), (0, 0.2, TRAINED, 2, nan),  # a scoring without a margin: not in the mean
            (1, 0.4, TRAINED, 0, nan))  # no margin at any scoring (a task without them)
    rows = record.record_dataset(table).to_list()
    assert rows[0]["aum"] == pytest.approx(0.5) and rows[0]["times_scored"] == 3
    assert math.isnan(rows[1]["aum"])


def test_the_margin_is_the_gold_logit_minus_the_largest_other_and_only_single_label_classification_has_one():
    from hf_selective_backprop.losses import ExampleLoss

    logits = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, -1.0], [1.0, 1.0, 1.0]])
    margins = ExampleLoss().margins(logits, torch.tensor([0, 2, -100]))
    assert margins[:2].tolist() == [1.0, -4.0] and math.isnan(margins[2])
    assert ExampleLoss("token-classification").margins(logits[None], torch.tensor([[0, 1, 2]])) is None
    assert ExampleLoss().margins(logits, torch.rand(3, 3)) is None  # class probabilities: no gold label
    assert ExampleLoss().margins(logits[:, :1], torch.tensor([0.5, 1.0, 0.0])) is None  # regression


def test_repeated_ids_in_one_flush_apply_in_order_and_nonfinite_losses_are_counted_apart():
    in_order, one_by_one = ExampleRecord(), ExampleRecord()
    rows = [(1, 0.1, TRAINED, 0), (2, 3.0, TRAINED, 0), (1, 2.0, TRAINED, 0), (1, float("nan"), TRAINED, 0)]
    _events(in_order, *rows)
    for row in rows:
        _events(one_by_one, row)
    for name in ("times_scored", "times_backpropagated", "forgetting_events", "nonfinite_losses", "last_loss"):
        torch.testing.assert_close(in_order[name][1:3], one_by_one[name][1:3], rtol=0, atol=0, msg=name)
    assert in_order["times_scored"][1] == 2 and in_order["nonfinite_losses"][1] == 1
    assert in_order["times_backpropagated"][1] == 3 and in_order["forgetting_events"][1] == 1


def test_the_record_grows_to_new_ids_and_its_state_round_trips():
    table = ExampleRecord()
    _events(table, (2, 0.5, TRAINED, 0))
    _events(table, (1000, 0.5, TRAINED, 0))
    restored = ExampleRecord()
    restored.load_state_dict(table.state_dict())
    assert restored.seen.tolist() == [2, 1000]
    with pytest.raises(ValueError, match="lacks"):
        ExampleRecord().load_state_dict({"times_scored": torch.zeros(1)})


def test_a_record_saved_before_the_margins_resumes_with_its_aum_covering_what_follows(caplog):
    table = ExampleRecord()
    _events(table, (0, 0.5, TRAINED, 0, 2.0), (1, 0.7, TRAINED, 0, 1.0))
    earlier = {name: value for name, value in table.state_dict().items()
               if name not in ("margin_sum", "times_margined")}
    resumed = ExampleRecord()
    resumed.load_state_dict(earlier)
    assert "aum covers only the scorings that follow" in caplog.text
    _events(resumed, (0, 0.4, TRAINED, 1, -1.0))
    rows = record.record_dataset(resumed).to_list()
    assert rows[0]["times_scored"] == 2 and rows[0]["aum"] == pytest.approx(-1.0) and math.isnan(rows[1]["aum"])


# ---- the trainer ------------------------------------------------------------------------------------------------

def test_every_built_in_strategy_is_covered_here():
    from hf_selective_backprop.selectors.registry import _FACTORIES

    built_in = {name for name, factory in _FACTORIES.items() if factory.__module__.startswith("hf_selective_backprop")}
    assert built_in - {"rholoss"} <= {name.replace("stale_", "") for name in STRATEGIES}


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_writes_a_record_that_counts_what_it_trained(output_dir, strategy):
    trainer = _trained(output_dir, "sb" if strategy == "stale_sb" else strategy,
                       **({"sb_staleness": 2} if strategy == "stale_sb" else {}))
    table = record.load_record(output_dir)
    assert table.column_names[0] == "index" and len(table) > 0
    backwards = sum(table["times_backpropagated"])
    # Margins come with every scoring of a classifier: from the selection forward and from the training forward.
    assert all(math.isfinite(aum) for aum in table["aum"])
    if strategy == "none":
        assert backwards == sum(table["times_scored"]) == 2 * 256 and len(table) == 256
        return
    stats = trainer.sb_stats
    assert backwards == stats["backwards"]
    # Every selection forward is a scoring, and so is every training forward no selection forward preceded.
    assert sum(table["times_scored"]) >= stats["selection_forwards"]
    if stats["selection_forwards"] == 0:
        assert sum(table["times_scored"]) == backwards
    assert (Path(output_dir) / record.DATA_MAP_FILE).stat().st_size > 10_000


def test_the_record_file_is_zstd_packed_and_reads_back_whole(output_dir):
    import pyarrow.parquet as pq

    from hf_selective_backprop.record import scores

    _trained(output_dir, "sb")
    metadata = pq.ParquetFile(Path(output_dir) / record.RECORD_FILE).metadata
    codecs = {metadata.row_group(0).column(i).compression for i in range(metadata.num_columns)}
    assert codecs == {"ZSTD"}
    table = record.load_record(output_dir)
    assert len(table) == 256 and set(table["region"]) <= {scores.EASY, scores.AMBIGUOUS, scores.HARD}


def test_none_with_the_record_trains_bit_for_bit_as_the_plain_trainer(tmp_path):
    plain = Trainer(model=TinyClassifier(), args=make_config(str(tmp_path / "plain")), train_dataset=make_dataset())
    plain.train()
    ours = _trained(str(tmp_path / "ours"), "none")
    assert ours.args.sb_record and os.path.isfile(tmp_path / "ours" / record.RECORD_FILE)
    assert torch.equal(_weights(ours.model), _weights(plain.model))
    assert ours.state.log_history[-1]["train_loss"] == plain.state.log_history[-1]["train_loss"]


@pytest.mark.parametrize("strategy", ["none", "sb"])
@pytest.mark.parametrize("pair", ["sft", "sft-packed", "seq2seq"])
def test_the_sft_and_seq2seq_pairs_write_the_record(output_dir, pair, strategy):
    from text_tiny import NEGATIVE, POSITIVE, tiny_t5, word_tokenizer

    common = dict(per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-2, report_to=[], use_cpu=True,
                  save_strategy="no", disable_tqdm=True, seed=0, sb_strategy=strategy)
    if pair.startswith("sft"):
        pytest.importorskip("trl", reason="the SFT pair needs TRL")
        from sft_data import prompt_completion, sft_model, sft_tokenizer

        from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer

        tokenizer, data = sft_tokenizer(), prompt_completion(48)
        packed = dict(packing=True, dataset_num_proc=None) if pair == "sft-packed" else {}
        args = SelectiveBackpropSFTConfig(output_dir, bf16=False, max_length=32, **packed, **common)
        trainer = SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args, train_dataset=data,
                                              processing_class=tokenizer)
    else:
        from transformers import DataCollatorForSeq2Seq

        from hf_selective_backprop import SelectiveBackpropSeq2SeqConfig, SelectiveBackpropSeq2SeqTrainer

        texts = POSITIVE + NEGATIVE
        tokenizer = word_tokenizer(texts)
        sources = [texts[i % len(texts)] for i in range(32)]
        data = Dataset.from_dict(dict(tokenizer(sources, text_target=[t.split()[0] for t in sources])))
        model = tiny_t5(tokenizer)
        trainer = SelectiveBackpropSeq2SeqTrainer(
            model=model, args=SelectiveBackpropSeq2SeqConfig(output_dir, **common), train_dataset=data,
            processing_class=tokenizer, data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
        data = [None] * 32
    trainer.train()
    if pair == "sft-packed" and strategy == "none":  # packed rows reach the model whole: no loss per example
        assert not trainer.record_keeper and not os.path.exists(os.path.join(output_dir, record.RECORD_FILE))
        return
    table = record.load_record(output_dir)
    backwards = trainer.sb_stats["backwards"] if strategy != "none" else 2 * len(data)
    assert sum(table["times_backpropagated"]) == backwards > 0
    assert len(table) == len(data)  # one row per example (per sequence of a packed row)
    assert all(math.isfinite(loss) for loss in table["mean_loss"])
    assert all(math.isnan(aum) for aum in table["aum"])  # language modelling defines no margin
    with pytest.raises(ValueError, match="needs margins, and this record has none"):
        record.label_issues(table, by="aum")


def test_the_record_off_writes_nothing(output_dir):
    _trained(output_dir, "sb", sb_record=False)
    assert not os.path.exists(os.path.join(output_dir, record.RECORD_FILE))


@pytest.mark.parametrize("strategy", ["none", "sb", "stale_sb"])
def test_a_resumed_run_ends_with_the_record_of_the_uninterrupted_one(tmp_path, strategy):
    name = "sb" if strategy == "stale_sb" else strategy
    extra = dict(num_train_epochs=3, save_strategy="steps", save_steps=7, **(
        {"sb_staleness": 2} if strategy == "stale_sb" else {}))
    full = str(tmp_path / "full")
    _trained(full, name, **extra)
    partial = str(tmp_path / "partial")
    _trained(partial, name, **extra)
    checkpoints = sorted(Path(partial).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    middle = checkpoints[len(checkpoints) // 2]
    assert (middle / RECORD_STATE_FILE).is_file()
    os.remove(Path(partial) / record.RECORD_FILE)
    args = make_config(partial, sb_strategy=name, **extra)
    resumed = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset())
    resumed.train(resume_from_checkpoint=str(middle))
    assert record.load_record(partial).to_dict() == record.load_record(full).to_dict()


def test_a_stream_with_ids_is_recorded_by_id(output_dir):
    rows = make_dataset(with_index=True).to_list()
    stream = IterableDataset.from_generator(lambda: (dict(row, index=row["index"] * 3 + 1) for row in rows))
    args = make_config(output_dir, sb_strategy="none", max_steps=40, num_train_epochs=1)
    SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=stream.with_format("torch")).train()
    table = record.load_record(output_dir)
    assert set(table["index"]) <= {3 * i + 1 for i in range(256)} and len(table) == 256
    assert sum(table["times_backpropagated"]) == 40 * 8


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "stream"), [("none", False), ("sb", False), ("sb", True)])
def test_two_processes_hold_one_record_of_every_rank_s_examples(tmp_path, strategy, stream):
    code, output = launch.run(tmp_path, ["--strategy", strategy, *(["--stream"] if stream else [])],
                              worker=Path(__file__).parent / "record_worker.py")
    assert code == 0, output[-3000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    for name, table in ranks[0]["record"].items():
        assert torch.equal(table, ranks[1]["record"][name]), name
    table = record.load_record(str(tmp_path / "trainer"))
    backwards = sum(table["times_backpropagated"])
    if strategy == "none":  # each rank trains its half of the 256 rows, twice
        assert len(table) == 256 and set(table["times_backpropagated"]) == {2}
    else:
        assert backwards == ranks[0]["backwards"] > 0
        # Kept rows trained in the epoch after their selection forward are scored again there (a few a boundary).
        carried = sum(table["times_scored"]) - ranks[0]["selection_forwards"]
        passes = -(-ranks[0]["selection_forwards"] // 256)
        assert 0 <= carried <= 2 * 8 * passes  # two ranks, fewer than a batch of 8 queued each
    if stream:
        assert ranks[0]["global_step"] == 24 and len(table) > 128  # both ranks' shares


# ---- the table, the Hub and the API -----------------------------------------------------------------------------

def test_push_to_hub_uploads_the_record_and_load_dataset_reads_it_back(tmp_path, monkeypatch):
    from huggingface_hub import CommitInfo, HfApi, RepoUrl

    uploads = []

    def upload_folder(api, *, repo_id, folder_path, **kwargs):
        files = {p.relative_to(folder_path).as_posix(): p.read_bytes() for p in Path(folder_path).rglob("*")
                 if p.is_file() and "checkpoint-" not in p.as_posix()}
        uploads.append(files)
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="",
                          commit_description="", oid="0")

    monkeypatch.setattr(HfApi, "create_repo", lambda api, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    output_dir = str(tmp_path / "run")
    trainer = _trained(output_dir, "sb", hub_model_id="you/tiny-sb")
    trainer.push_to_hub()
    (files,) = uploads
    assert {record.RECORD_FILE, record.DATA_MAP_FILE} <= set(files)
    card = files["README.md"].decode()
    assert "## Example record" in card and 'load_dataset("you/tiny-sb", data_files="example_record.parquet"' in card
    repo = tmp_path / "downloaded"
    repo.mkdir()
    (repo / record.RECORD_FILE).write_bytes(files[record.RECORD_FILE])
    read_back = load_dataset(str(repo), data_files=record.RECORD_FILE, split="train")
    assert read_back.to_dict() == record.load_record(output_dir).to_dict()


def _noisy_dataset(n=240, flipped=24, seed=0):
    data = make_dataset(n, seed)
    labels = torch.tensor(data.with_format(None)["labels"])
    flips = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:flipped]
    labels[flips] = (labels[flips] + 1) % 3
    return data.remove_columns("labels").add_column("labels", labels.tolist()).with_format("torch"), set(flips.tolist())


def test_label_issue_candidates_rank_flipped_labels_first(output_dir):
    data, flipped = _noisy_dataset()
    args = make_config(output_dir, sb_strategy="none", num_train_epochs=6)
    SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=data).train()
    table = record.load_record(output_dir)
    for by, column, descending in (("last_loss", "last_loss", True), ("mean_loss", "mean_loss", True),
                                   ("confidence", "confidence", False), ("aum", "aum", False)):
        ranked = record.label_issues(table, top=len(flipped), by=by)
        assert len(flipped & set(ranked["index"])) / len(flipped) > 0.5, by  # 0.1 by chance
        assert ranked["label_issue_rank"] == list(range(len(flipped)))
        values = ranked[column][::-1] if descending else ranked[column]
        assert values == sorted(values), by
    default = record.label_issues(table, top=len(flipped))
    assert default["index"] == record.label_issues(table, top=len(flipped), by="last_loss")["index"]
    flagged = record.label_issues(table)  # not learned at the last scoring: p(gold) = exp(-loss) < 1/2
    assert flagged["index"] == record.label_issues(table, top=len(table))["index"][: len(flagged)]
    assert len(flagged) == sum(loss > math.log(2) for loss in table["last_loss"])


def test_label_issues_rank_by_mean_loss_or_by_confidence_and_put_unscored_rows_last():
    nan = float("nan")
    # Row 1: one scoring at p(gold) 0.001 and one at 0.7 (mean loss 3.63): likelier by loss than row 0 (p 0.3
    # twice, loss 1.20), less likely by confidence (0.35 against 0.30). Row 2 never scored.
    table = Dataset.from_dict({"index": [0, 1, 2], "mean_loss": [1.20, 3.63, nan], "last_loss": [1.20, 0.36, nan],
                               "confidence": [0.30, 0.35, nan], "variability": [0.0, 0.35, nan],
                               "region": [record.HARD, record.HARD, None]})
    assert record.label_issues(table, top=3, by="mean_loss")["index"] == [1, 0, 2]
    assert record.label_issues(table, top=3, by="last_loss")["index"] == [0, 1, 2]
    assert record.label_issues(table, top=3, by="confidence")["index"] == [0, 1, 2]
    with pytest.raises(ValueError, match="by must be one of mean_loss, last_loss, confidence, aum, got 'margin'"):
        record.label_issues(table, by="margin")
    with pytest.raises(ValueError, match=r"reads the record's \['aum'\] column, which this record lacks"):
        record.label_issues(table, by="aum")  # a record written before the margins


def _a_record(scores):
    return Dataset.from_dict({"index": list(range(len(scores))), "mean_loss": scores,
                              "confidence": [-s for s in scores]})


@pytest.mark.parametrize("by", ["random", "confidence"])
def test_a_subset_drawn_with_the_label_noises_seed_holds_the_noise_at_its_rate(by):
    # One seed for the flips and the subset: a draw retracing the flips' permutation keeps every flipped label
    # (a share of 0.25 in a random 80 % of 20 % noise). 'confidence' ties everywhere but at one row (a score tied
    # everywhere is refused): its tie-break is that draw.
    count = 2000
    _, flipped = flip_labels(torch.zeros(count, dtype=torch.long), 0.2, 10, seed=0)
    ids = numpy.arange(count)
    table = Dataset.from_dict({"index": ids.tolist(), "confidence": [0.6] + [0.5] * (count - 1)})
    kept = kept_ids(table, ids, 0.8, by, seed=0, id_column="index")
    assert len(kept) == 1600 and abs(numpy.isin(kept, flipped.numpy()).mean() - 0.2) < 0.03


def test_prune_keeps_the_highest_scores_and_random_is_a_seeded_subset_of_the_same_size():
    data = make_dataset(100, with_index=True).with_format(None)
    table = _a_record([float(i % 10) for i in range(100)])
    hardest = record.prune(data, table, keep=0.3, by="mean_loss")
    assert len(hardest) == 30 and set(hardest["index"]) == {i for i in range(100) if i % 10 >= 7}
    first, again = (record.prune(data, table, keep=0.3, by="random", seed=1) for _ in range(2))
    other = record.prune(data, table, keep=0.3, by="random", seed=2)
    assert len(first) == 30 and list(first["index"]) == list(again["index"]) != list(other["index"])
    partial = table.select(range(50))  # ids 50-99 never seen: they rank last
    assert set(record.prune(data, partial, keep=0.5, by="confidence")["index"]) == set(range(50))
    with pytest.raises(ValueError, match="must be one of"):
        record.prune(data, table, keep=0.3, by="shoe_size")
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        record.prune(data, table, keep=0.0)


def test_the_label_issues_subset_drops_the_highest_last_losses_first():
    last = [0.3, 2.5, 0.1, 1.7, 0.9, 3.0, 0.2, 0.4, 0.05, 0.6]
    table = Dataset.from_dict({"index": list(range(10)), "last_loss": last})
    kept = kept_ids(table, numpy.arange(10), 0.7, "label_issues", seed=0, id_column="index")
    assert set(range(10)) - set(kept.tolist()) == {5, 1, 3}  # record.label_issues' first three


def test_sb_subset_from_trains_on_the_records_choice(tmp_path):
    first = str(tmp_path / "first")
    _trained(first, "none")
    second = str(tmp_path / "second")
    trainer = _trained(second, "none", sb_subset_from=first, sb_subset_keep=0.25, sb_subset_by="mean_loss")
    kept = record.load_record(second)
    assert len(kept) == 64 and sum(kept["times_backpropagated"]) == 2 * 64
    earlier = record.load_record(first)
    losses = dict(zip(earlier["index"], earlier["mean_loss"], strict=True))
    threshold = sorted(losses.values(), reverse=True)[63]
    assert all(losses[i] >= threshold for i in kept["index"])
    assert trainer.state.global_step == 2 * 64 // 8


@pytest.mark.parametrize(("flags", "message"), [
    (dict(sb_subset_from="/nowhere/run", sb_subset_keep=0.5), "--sb_subset_from '/nowhere/run'"),
    (dict(sb_subset_keep=0.5), "give that record with --sb_subset_from"),
    (dict(sb_subset_from="x", sb_subset_keep=1.5), "--sb_subset_keep in"),
    (dict(sb_subset_from="x"), "--sb_subset_keep in"),
    (dict(sb_subset_from="x", sb_subset_keep=0.5, sb_subset_by="size"), "--sb_subset_by must be one of"),
])
def test_bad_subset_flags_are_refused_before_training_naming_the_flag(output_dir, flags, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        args = make_config(output_dir, sb_strategy="none", **flags)
        SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset())


def test_a_record_of_another_id_column_is_refused_naming_the_columns(tmp_path):
    from hf_selective_backprop.record.files import write_record
    from hf_selective_backprop.record.table import SCORED, ExampleRecord

    path = str(tmp_path / "other.parquet")
    keyed_by_idx = ExampleRecord()
    keyed_by_idx.apply(torch.tensor([0, 1]), torch.tensor([0.1, 0.2]), torch.tensor([SCORED] * 2), torch.zeros(2))
    write_record(keyed_by_idx, path, "idx")
    args = make_config(str(tmp_path / "run"), sb_strategy="none", sb_subset_from=path, sb_subset_keep=0.5,
                       sb_subset_by="mean_loss")
    with pytest.raises(ValueError, match="has no \\['index'\\] column"):
        SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset())


def test_the_data_map_names_its_regions(tmp_path):
    generator = numpy.random.default_rng(0)
    n = 300
    table = Dataset.from_dict({
        "confidence": generator.uniform(0, 1, n).tolist(), "variability": generator.uniform(0, 0.5, n).tolist(),
        "correctness": generator.uniform(0, 1, n).tolist(),
        "region": [[record.EASY, record.AMBIGUOUS, record.HARD][i % 3] for i in range(n)],
    })
    counts = record.data_map(table, str(tmp_path / "map.png"), title="test")
    assert counts == {record.EASY: 100, record.AMBIGUOUS: 100, record.HARD: 100}
    assert (tmp_path / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(tmp_path / "map.png") as image:
        assert image.mode == "P"  # the palette PNG, a third of a true-colour one's size
    record.data_map(table, str(tmp_path / "map.pdf"))
    assert (tmp_path / "map.pdf").read_bytes()[:5] == b"%PDF-"


@pytest.mark.parametrize(("learned", "classes", "barely"), [
    (0.2, 2, True), (0.6, 2, True), (0.9, 2, False),  # chance is 1/2: a quarter of the way to all right is 0.625
    (0.2, 10, True), (0.5, 10, False),  # chance is 1/10: half the scorings right is well above it
    (0.2, None, False),  # chance unknown: nothing claimed
])
def test_the_data_map_draws_its_cuts_and_says_when_the_model_barely_learned(tmp_path, monkeypatch, learned, classes,
                                                                            barely):
    from matplotlib.axes import Axes

    drawn = {"text": [], "vertical": []}
    monkeypatch.setattr(Axes, "axvline", lambda axes, x, **kw: drawn["vertical"].append(x))
    real_text = Axes.text
    monkeypatch.setattr(Axes, "text", lambda axes, x, y, s, **kw: drawn["text"].append(s) or real_text(
        axes, x, y, s, **kw))
    table = Dataset.from_dict({
        "confidence": [0.9, 0.8, 0.2, 0.1, 0.5, 0.5], "variability": [0.0, 0.01, 0.0, 0.02, 0.3, 0.4],
        "correctness": [learned] * 6,
        "region": [record.EASY, record.EASY, record.HARD, record.HARD, record.AMBIGUOUS, record.AMBIGUOUS],
    })
    record.data_map(table, str(tmp_path / "map.png"), classes=classes)
    assert drawn["vertical"] == [pytest.approx(0.3)]  # the least variable ambiguous example: the cut
    assert any("barely learned" in text for text in drawn["text"]) == barely


def test_a_classifiers_record_holds_its_class_count_and_its_data_map_uses_it(output_dir):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16, num_labels=3)
    generator = torch.Generator().manual_seed(0)
    rows = Dataset.from_dict({"input_ids": torch.randint(1, 30, (48, 8), generator=generator).tolist(),
                              "labels": [i % 3 for i in range(48)]})
    args = make_config(output_dir, sb_strategy="none", num_train_epochs=1)
    SelectiveBackpropTrainer(model=BertForSequenceClassification(config), args=args, train_dataset=rows).train()
    table = record.load_record(output_dir)
    assert record_metadata(table)["classes"] == 3  # what record.data_map reads chance from by default


def test_the_regions_put_the_most_variable_third_in_ambiguous():
    from hf_selective_backprop.record.scores import regions

    confidence = torch.tensor([0.9, 0.9, 0.1, 0.1, 0.5, 0.5])
    variability = torch.tensor([0.0, 0.01, 0.0, 0.02, 0.3, 0.4])
    assert regions(confidence, variability) == [record.EASY, record.EASY, record.HARD, record.HARD,
                                                record.AMBIGUOUS, record.AMBIGUOUS]


def test_config_flags_parse_from_the_command_line():
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(SelectiveBackpropConfig).parse_args_into_dataclasses(
        ["--output_dir", "x", "--sb_record", "False", "--sb_subset_from", "r", "--sb_subset_keep", "0.5",
         "--sb_subset_by", "variability", "--use_cpu"])
    assert (args.sb_record, args.sb_subset_from, args.sb_subset_keep, args.sb_subset_by) == (
        False, "r", 0.5, "variability")
