"""Multi-process runs: 2 CPU processes over gloo, launched by torchrun and by accelerate launch.

Each run is one launch of ``tests/dist_worker.py`` (a tiny MLP on synthetic data) that writes
``rank{r}.pt`` per process; the tests compare what the ranks wrote. A launch that hangs (no output for
``launch.QUIET`` seconds, times how slow the machine is) is killed and fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from dist_worker import NAN_IDS, id_loss
from launch import launch as _launch
from launch import resumes_cpu_processes, run

from hf_selective_backprop.engine.accounting import COUNTERS

EXAMPLES = 256

pytestmark = pytest.mark.slow

# Rank 1's per-example losses are shifted by +100: it keeps ~3x as many rows as rank 0, so the
# ranks' queues fill at very different rates. Batch 4 x 2 accumulation steps; history of 300
# (smaller than the 512 losses of the run, so the ring buffer wraps).
UNEVEN = ["--loss", "uneven", "--keep", "0.5", "--batch", "4", "--grad-accum", "2", "--history", "300"]
UNEVEN_EPOCHS = 2
# Stale-SB (n = 2) with losses that are a known function of the id, local history scope, a
# checkpoint every 7 steps (step 7 falls mid-way through the stale epoch 1) and augmentation drawn
# by each rank's collator.
STALE = ["--loss", "id", "--staleness", "2", "--scope", "local", "--epochs", "4", "--batch", "4",
         "--grad-accum", "2", "--save-steps", "7", "--augment"]  # fmt: skip
STALE_EPOCHS = 4
CHECKPOINT_STEP = 7


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


def _stats_json(out: Path) -> dict:
    return json.loads((out / "trainer" / "sb_stats.json").read_text())


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    out = tmp_path_factory.mktemp("uneven")
    return out, _launch(out, UNEVEN + ["--epochs", str(UNEVEN_EPOCHS)])


@pytest.fixture(scope="module")
def stale(tmp_path_factory):
    out = tmp_path_factory.mktemp("stale")
    return out, _launch(out, STALE)


def _checkpoint(stale_out: Path) -> Path:
    return stale_out / "trainer" / f"checkpoint-{CHECKPOINT_STEP}"


# ---- lockstep under uneven selection ------------------------------------------------------


def test_uneven_selection_keeps_ranks_in_lockstep(uneven):
    _, ranks = uneven
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["distributed_type"] == "DistributedType.MULTI_CPU" for r in ranks)
    kept = [r["stats"]["kept"] for r in ranks]
    # The scenario is really uneven: rank 1 selects far more than rank 0 ...
    assert kept[1] > 2 * kept[0] > 0, kept
    assert ranks[1]["queue"] > ranks[0]["queue"]
    # ... yet both took the same optimizer steps and hold the same weights.
    steps = [r["global_step"] for r in ranks]
    assert steps[0] == steps[1] > 0
    assert [r["stats"]["optimizer_steps"] for r in ranks] == steps
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])


def test_global_history_is_the_union_of_all_ranks_losses(uneven):
    _, ranks = uneven
    batches = [r["selection_losses"] for r in ranks]
    assert len(batches[0]) == len(batches[1]) == ranks[0]["selection_batches_per_epoch"] * UNEVEN_EPOCHS
    # Per selection batch: rank 0's losses, then rank 1's; the ring buffer keeps the last 300.
    union = torch.cat([torch.cat(pair) for pair in zip(*batches, strict=True)])
    for r in ranks:
        assert r["history"].numel() == 300
        assert torch.equal(r["history"], union[-300:])


def test_weighted_loss_has_the_models_scale_across_ranks(uneven):
    """All-one selection weights give the model's own loss. The worker's model takes loss kwargs
    (like transformers' models), so the step's item count is summed over ranks and the Trainer
    multiplies the loss by the number of processes; a weighted loss that missed that factor
    would train with 1/world_size of the gradient."""
    _, ranks = uneven
    for r in ranks:
        check = r["weighted_loss"]
        assert check["num_items"] == 8  # 4 rows on each of the 2 ranks
        assert check["weighted"] == pytest.approx(check["reference"], rel=1e-6)


def test_local_history_holds_only_the_ranks_own_losses(stale):
    _, ranks = stale
    for r in ranks:
        own = torch.cat(r["selection_losses"])  # scored and (stale epochs) looked-up losses
        size = r["history"].numel()
        assert size == min(own.numel(), 1024)
        assert torch.equal(r["history"], own[-size:])
    assert not torch.equal(ranks[0]["history"], ranks[1]["history"])


# ---- Stale-SB store ------------------------------------------------------------------------


def test_stale_store_is_identical_on_every_rank_and_aligned_with_ids(stale):
    _, ranks = stale
    store = ranks[0]["store"]
    assert _same_nan(store["losses"], ranks[1]["store"]["losses"])
    assert torch.equal(store["epochs"], ranks[1]["store"]["epochs"])
    ids = torch.arange(EXAMPLES)
    assert store["losses"].numel() == EXAMPLES
    # Every example was stored with the loss of its own id (a misaligned row would not match).
    assert torch.equal(store["losses"], id_loss(ids))
    # Epoch 2 scored everything; in the stale epoch 3 the trained rows were refreshed.
    assert set(store["epochs"].tolist()) == {2, 3}
    # Stale epochs are decided once, on the main process, before loading: the lookups are counted there.
    assert ranks[0]["stats"]["stale_lookups"] > 0


# ---- accounting ----------------------------------------------------------------------------


@pytest.mark.parametrize("run, batch, grad_accum, epochs", [("uneven", 4, 2, UNEVEN_EPOCHS), ("stale", 4, 2, 4)])
def test_accounting_is_summed_over_ranks(run, batch, grad_accum, epochs, request):
    out, ranks = request.getfixturevalue(run)
    stats = _stats_json(out)
    rows_per_rank = ranks[0]["rows_per_epoch"] * epochs
    assert stats["examples_seen"] == 2 * rows_per_rank == sum(r["stats"]["examples_seen"] for r in ranks)
    assert stats["optimizer_steps"] == ranks[0]["global_step"]
    assert stats["backwards"] == stats["optimizer_steps"] * batch * grad_accum * 2
    assert stats["kept"] == sum(r["stats"]["kept"] for r in ranks)
    assert stats["selection_forwards"] + stats["stale_lookups"] == stats["considered"] == stats["examples_seen"]


# ---- determinism and launchers -------------------------------------------------------------


@pytest.fixture(scope="module")
def uneven_by_accelerate(tmp_path_factory):
    """The `uneven` run again, launched by `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml`."""
    out = tmp_path_factory.mktemp("uneven_accelerate")
    return out, _launch(out, UNEVEN + ["--epochs", str(UNEVEN_EPOCHS)], launcher="accelerate")


def test_accelerate_launch_starts_two_gloo_processes(uneven_by_accelerate):
    _, ranks = uneven_by_accelerate
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["world_size"] == 2 and r["distributed_type"] == "DistributedType.MULTI_CPU" for r in ranks)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])


def test_two_identical_runs_give_identical_weights(uneven, uneven_by_accelerate):
    """Same worker, arguments, seed and 2 gloo processes; only the launcher differs (one launch
    fewer than a second torchrun run, and it shows the launcher changes nothing)."""
    _, first = uneven
    _, second = uneven_by_accelerate
    for a, b in zip(first, second, strict=True):
        assert a["global_step"] == b["global_step"]
        assert _same_weights(a["weights"], b["weights"])
        assert torch.equal(a["history"], b["history"])
        assert _same_nan(a["store"]["losses"], b["store"]["losses"])
        assert a["stats"]["kept"] == b["stats"]["kept"] and a["queue"] == b["queue"]


# ---- checkpoints ---------------------------------------------------------------------------


def test_checkpoint_layout_and_mid_epoch_position(stale):
    out, ranks = stale
    folder = _checkpoint(out)
    names = {path.name for path in folder.iterdir()}
    assert {"sb_state.pt", "sb_rank_state_0.pt", "sb_rank_state_1.pt"} <= names
    shared = torch.load(folder / "sb_state.pt", weights_only=False)
    assert shared["world_size"] == 2
    assert shared["epoch"] == 1  # a stale epoch: the resumed run selects from the restored store
    assert 0 < shared["consumed"] < ranks[0]["selection_batches_per_epoch"]


@resumes_cpu_processes
def test_resume_in_two_processes_continues_exactly(stale, tmp_path):
    out, finished = stale
    resumed = _launch(tmp_path, STALE + ["--resume", str(_checkpoint(out))])
    shared = torch.load(_checkpoint(out) / "sb_state.pt", weights_only=False)
    for a, b in zip(finished, resumed, strict=True):
        assert b["restored"]["epoch"] == shared["epoch"] and b["restored"]["skip"] == shared["consumed"]
        # Same processes, settings and data: nothing to warn about.
        ours = ("was saved by", "random state", "Resuming from", "does not record")
        assert not any(text in w for w in b["warnings"] for text in ours), b["warnings"]
        assert a["global_step"] == b["global_step"]
        assert _same_weights(a["weights"], b["weights"])
        assert not torch.equal(a["augmentation"], finished[1 - a["rank"]]["augmentation"])  # each rank its own
        assert torch.equal(a["augmentation"], b["augmentation"])
        assert torch.equal(a["history"], b["history"])  # per-rank (local) history restored per rank
        assert _same_nan(a["store"]["losses"], b["store"]["losses"])
        assert torch.equal(a["store"]["epochs"], b["store"]["epochs"])
        assert a["queue"] == b["queue"]
        counters = ("examples_seen", "kept", "backwards", "optimizer_steps", "selection_forwards", "stale_lookups")
        assert {k: a["stats"][k] for k in counters} == {k: b["stats"][k] for k in counters}


def test_resume_in_one_process_warns_and_continues(stale, tmp_path):
    out, two = stale
    folder = _checkpoint(out)
    (one,) = _launch(tmp_path, STALE + ["--resume", str(folder)], launcher="plain")
    assert one["world_size"] == 1
    assert any("was saved by 2 processes and this run has 1" in w for w in one["warnings"])
    shared = torch.load(folder / "sb_state.pt", weights_only=False)
    rank_states = [torch.load(folder / f"sb_rank_state_{r}.pt", weights_only=False) for r in range(2)]
    restored = one["restored"]
    # The shared store and history come back as saved.
    assert _same_nan(restored["store"]["losses"], shared["store"]["losses"])
    assert torch.equal(restored["selector"]["history"]["values"], shared["selector"]["history"]["values"])
    # Both old ranks' queued rows are taken over.
    queued = [len(s["queue"]["rows"].get("index", [])) for s in rank_states]
    assert restored["queue"] == sum(queued)
    # The position converts: 2 ranks x `consumed` batches each = 2 x consumed batches of one process,
    # so the resumed epoch reads exactly the examples the two ranks had not read yet: in this stale
    # epoch, every example its plan (restored with the checkpoint) loads, each at least once.
    epoch, consumed = shared["epoch"], shared["consumed"]
    assert restored["epoch"] == epoch and restored["skip"] == 2 * consumed
    before = [ids for r in two for e, ids in [x for x in r["read"] if x[0] == epoch][:consumed]]
    after = [ids for e, ids in one["read"] if e == epoch]
    read = torch.cat(before + after)
    assert set(read.tolist()) == set(restored["planned"].reshape(-1).tolist())
    assert read[: len(torch.cat(before))].unique().numel() == len(torch.cat(before))  # no row read twice
    # Training went on to the end of the run; the stored losses still belong to their ids.
    assert one["global_step"] > CHECKPOINT_STEP
    stats = _stats_json(tmp_path)
    assert stats["examples_seen"] == EXAMPLES * STALE_EPOCHS
    assert torch.equal(one["store"]["losses"], id_loss(torch.arange(EXAMPLES)))
    assert all(torch.isfinite(v).all() for v in one["weights"].values())


def test_a_strategy_defined_outside_the_package_keeps_two_processes_in_lockstep(tmp_path):
    ranks = _launch(tmp_path, ["--strategy", "easiest", "--keep", "0.5", "--staleness", "2", "--epochs", "3"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    assert all(r["selector_state"]["calls"] > 0 for r in ranks)
    stats = _stats_json(tmp_path)
    assert stats["kept_fraction"] == pytest.approx(0.5, abs=0.05)
    assert stats["examples_seen"] == 3 * EXAMPLES and stats["stale_lookups"] == EXAMPLES


def test_infobatch_decides_the_same_on_every_rank(tmp_path):
    ranks = _launch(tmp_path, ["--strategy", "infobatch", "--epochs", "3"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    stats = _stats_json(tmp_path)
    assert stats["selection_forwards"] == 0
    # One plan, broadcast: the ranks together load each kept example once, and pruned ones not at all.
    assert stats["examples_seen"] == 3 * EXAMPLES
    assert 2 * EXAMPLES < stats["examples_loaded"] < 3 * EXAMPLES


def test_early_prune_trains_one_subset_on_every_rank(tmp_path):
    ranks = _launch(tmp_path, ["--strategy", "early_prune", "--keep", "0.5", "--epochs", "3"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    stats = _stats_json(tmp_path)
    assert stats["selection_forwards"] == 0 and stats["examples_seen"] == 3 * EXAMPLES
    # Everything in the first epoch, then the plan's half in each of the two others: one plan for both ranks.
    assert stats["examples_loaded"] == EXAMPLES + 2 * EXAMPLES // 2


def test_text_rows_of_different_lengths_keep_two_processes_in_lockstep(tmp_path):
    ranks = _launch(tmp_path, ["--text", "--keep", "0.5", "--batch", "4", "--grad-accum", "2", "--epochs", "2"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    assert all(torch.isfinite(v).all() for v in ranks[0]["weights"].values())
    stats = _stats_json(tmp_path)
    assert stats["selection_forwards"] == 2 * EXAMPLES
    assert 0 < stats["backwards"] <= stats["kept"] < 2 * EXAMPLES
    assert {r["sb_stats"]["backwards"] for r in ranks} == {stats["backwards"]}


# ---- resume of an augmented run with BatchNorm ---------------------------------------------

# As `scripts/train.py` trains CIFAR, in small: a conv net with BatchNorm and dropout, images the
# dataset augments, Stale-SB n=2 with the cross-entropy of the logits (selection depends on the
# model). Checkpoint 3 falls in the scored epoch 0, where each rank's selection forwards use its own
# BatchNorm statistics; DDP makes them equal again only at the next training forward.
IMAGES = ["--images", "--loss", "ce", "--staleness", "2", "--epochs", "3", "--examples", "128", "--batch", "4",
          "--keep", "0.5", "--save-steps", "3"]  # fmt: skip


@resumes_cpu_processes
def test_augmented_stale_sb_with_batch_norm_resumes_exactly_in_two_processes(tmp_path):
    finished = _launch(tmp_path / "finished", IMAGES)
    checkpoint = tmp_path / "finished" / "trainer" / "checkpoint-3"
    assert torch.load(checkpoint / "sb_state.pt", weights_only=False)["epoch"] == 0
    resumed = _launch(tmp_path / "resumed", IMAGES + ["--resume", str(checkpoint)])
    # The ranks' BatchNorm statistics differ (so the per-rank buffers are what the test is about).
    assert not torch.equal(finished[0]["weights"]["net.1.running_mean"], finished[1]["weights"]["net.1.running_mean"])
    for a, b in zip(finished, resumed, strict=True):
        assert a["global_step"] == b["global_step"] > 3
        assert _same_weights(a["weights"], b["weights"])
        assert torch.equal(a["augmentation"], b["augmentation"])
        assert {k: a["stats"][k] for k in COUNTERS} == {k: b["stats"][k] for k in COUNTERS}
        assert a["queue"] == b["queue"] and torch.equal(a["history"], b["history"])
    assert _stats_json(tmp_path / "finished")["backwards"] == _stats_json(tmp_path / "resumed")["backwards"]


@resumes_cpu_processes
def test_a_run_without_selection_resumes_its_augmentation_exactly_in_two_processes(tmp_path):
    # The Trainer's own loop (--sb_strategy none) reads ahead too: without each rank's augmentation state as of the
    # batch it had not read, a resumed run drew other crops and ended with other weights.
    plain = ["--images", "--strategy", "none", "--epochs", "2", "--examples", "128", "--batch", "4",
             "--save-steps", "3"]
    finished = _launch(tmp_path / "finished", plain)
    checkpoint = tmp_path / "finished" / "trainer" / "checkpoint-3"  # mid-epoch, a batch loaded ahead on each rank
    # Each rank's pipeline state, and the example record (one for both: every rank holds the same).
    assert {path.name for path in checkpoint.glob("sb_*")} == {"sb_data_state_0.pt", "sb_data_state_1.pt",
                                                                "sb_record.pt"}
    resumed = _launch(tmp_path / "resumed", plain + ["--resume", str(checkpoint)])
    for a, b in zip(finished, resumed, strict=True):
        assert a["global_step"] == b["global_step"] == 32
        assert _same_weights(a["weights"], b["weights"])
        assert torch.equal(a["augmentation"], b["augmentation"])


# ---- lockstep when ranks read different numbers of undecided rows ---------------------------

# Stale-SB n=2, global history: epoch 1 is planned from the losses stored in epoch 0. Rows without a
# finite stored loss are loaded and scored in epoch 1, which runs collectives (store, history); each
# falls on one rank, so in some selection batches one rank scores rows and the other has none.
LOCKSTEP = ["--loss", "id", "--staleness", "2", "--epochs", "2"]


def _read_ids(rank: dict, epoch: int) -> list[set[int]]:
    return [set(ids.tolist()) for e, ids in rank["read"] if e == epoch]


def _assert_lockstep(ranks: list[dict], unscored: set[int]) -> None:
    # The scenario: in some selection batch of the planned epoch, exactly one rank reads an unscored row.
    batches = [_read_ids(r, 1) for r in ranks]
    assert any(bool(a & unscored) != bool(b & unscored) for a, b in zip(*batches, strict=True)), batches
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    # Every rank joined every gather: one store, one global history.
    assert _same_nan(ranks[0]["store"]["losses"], ranks[1]["store"]["losses"])
    assert torch.equal(ranks[0]["history"], ranks[1]["history"])


def test_rows_dropped_by_drop_last_are_scored_later_in_lockstep(tmp_path):
    # 258 rows, 2 ranks x 8: epoch 0 drops 2 rows, never scored, so epoch 1 loads them to score.
    examples = 258
    ranks = _launch(tmp_path, LOCKSTEP + ["--drop-last", "--examples", str(examples)])
    dropped = set(range(examples)) - set().union(*_read_ids(ranks[0], 0), *_read_ids(ranks[1], 0))
    assert len(dropped) == examples % 16
    _assert_lockstep(ranks, dropped)
    assert torch.equal(ranks[0]["store"]["losses"], id_loss(torch.arange(examples)))


def test_non_finite_stored_losses_on_one_rank_keep_ranks_in_lockstep(tmp_path):
    ranks = _launch(tmp_path, LOCKSTEP + ["--loss", "id-nan"])
    _assert_lockstep(ranks, set(NAN_IDS))
    expected = id_loss(torch.arange(EXAMPLES))
    expected[list(NAN_IDS)] = float("nan")
    assert _same_nan(ranks[0]["store"]["losses"], expected)


def test_rholoss_scores_the_reference_once_and_keeps_two_processes_in_lockstep(tmp_path):
    ranks = _launch(tmp_path, ["--strategy", "rholoss", "--reference", "--keep", "0.5", "--staleness", "2",
                               "--epochs", "3"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    # Each rank scored its share; both hold every example's irreducible loss.
    assert torch.equal(ranks[0]["irreducible"], ranks[1]["irreducible"])
    assert ranks[0]["irreducible"].numel() == EXAMPLES and torch.isfinite(ranks[0]["irreducible"]).all()
    stats = _stats_json(tmp_path)
    assert stats["reference_forwards"] == EXAMPLES
    assert stats["examples_seen"] == 3 * EXAMPLES and stats["stale_lookups"] == EXAMPLES


def test_rholoss_counts_each_reference_forward_once_when_the_last_batch_is_padded(tmp_path):
    # 257 rows in reference batches of 8 per rank: the sampler repeats 15 rows to fill both ranks' last batch, and
    # those were counted too (272), charging a budget for rows already scored.
    ranks = _launch(tmp_path, ["--strategy", "rholoss", "--reference", "--keep", "0.5", "--examples", "257",
                               "--epochs", "1"])
    assert ranks[0]["irreducible"].numel() == 257 and torch.isfinite(ranks[0]["irreducible"]).all()
    assert sum(rank["stats"]["reference_forwards"] for rank in ranks) == 257
    assert _stats_json(tmp_path)["reference_forwards"] == 257


def test_split_batches_is_refused_before_training(tmp_path):
    """Accelerate's split_batches divides each loaded batch over the processes; selection assembles each process's
    micro-batches at the Trainer's batch size, so a step would train twice the rows: refused, naming the fix."""
    code, output = run(tmp_path, ["--examples", "64", "--batch", "4", "--split-batches"])
    assert code not in (None, 0)
    assert "split_batches=True (accelerator_config) on 2 processes is not supported" in output
    assert "per_device_train_batch_size to the global batch size / 2" in output
    assert not list(tmp_path.glob("rank*.pt"))  # nothing trained


def test_uneven_batches_keep_ranks_in_lockstep(tmp_path):
    """even_batches=False: the engine's sampler gives every rank the same number of selection batches anyway."""
    ranks = _launch(tmp_path, ["--examples", "67", "--batch", "4", "--uneven-batches"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
