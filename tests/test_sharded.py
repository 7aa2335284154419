"""Selection under sharded weights: DeepSpeed ZeRO-2/3 through the Trainer and FSDP2 at the engine level.

A model whose weights are split over the ranks (ZeRO-3, FSDP) all-gathers them in every forward, so every
rank must run the same number of forwards. Selection scores different numbers of rows on different ranks
(a Stale-SB epoch's stored losses, a planned batch, ``dataloader_drop_last`` on an odd dataset size); the
engine's lockstep forwards keep them together. Each launch is 2 CPU processes over gloo, killed once it goes
quiet (``launch.watch``), so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from dist_worker import save_pretrained_pair
from launch import ROOT, launch, run
from torch.utils.cpp_extension import get_default_build_root

pytestmark = pytest.mark.slow

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="DeepSpeed is not installed (pip install 'hf-selective-backprop[deepspeed]'; make venv installs it)",
)
FSDP_WORKER = ROOT / "tests" / "fsdp_worker.py"
# 67 rows, 4 per micro-batch, dataloader_drop_last: the ranks hold different numbers of rows to score.
ODD = ["--examples", "67", "--batch", "4", "--drop-last"]
STALE = ["--strategy", "sb", "--staleness", "2", "--loss", "id", "--epochs", "4", "--save-steps", "5", *ODD]
KATH18 = ["--strategy", "kath18", "--epochs", "2", "--examples", "135", "--batch", "4", "--drop-last"]
RHOLOSS = ["--strategy", "rholoss", "--reference", "--keep", "0.5", "--epochs", "2", *ODD]
RESUME_STEP = 5


@pytest.fixture(scope="module", autouse=True)
def no_build_lock_left():
    """DeepSpeed loads its CPU op through torch's extension loader, which leaves the build folder's ``lock`` file
    (torch 2.14 locks it with an advisory lock, but older releases wait on any such file forever): removed once
    this module's launches are over, as make venv removes it after the build."""
    yield
    root = os.environ.get("TORCH_EXTENSIONS_DIR", get_default_build_root())
    for lock in glob.glob(os.path.join(root, "**", "deepspeed_shm_comm", "lock"), recursive=True):
        os.remove(lock)


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _same_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


def _close_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=1e-6) for k in a)


@pytest.fixture(scope="module")
def ddp_stale(tmp_path_factory):
    """The Stale-SB run without DeepSpeed: the weights ZeRO must reproduce."""
    return launch(tmp_path_factory.mktemp("ddp"), STALE)


@pytest.fixture(scope="module")
def zero3_stale(tmp_path_factory):
    out = tmp_path_factory.mktemp("zero3")
    return out, launch(out, [*STALE, "--zero", "3"])


@needs_deepspeed
def test_zero3_stale_sb_keeps_ranks_in_lockstep_and_trains_as_ddp(zero3_stale, ddp_stale):
    out, ranks = zero3_stale
    assert [r["distributed_type"] for r in ranks] == ["DistributedType.DEEPSPEED"] * 2
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == ddp_stale[0]["global_step"]
    # Rows only one rank had to score made the other run forwards it threw away: without them this run hangs.
    stats = json.loads((out / "trainer" / "sb_stats.json").read_text())
    assert stats["lockstep_forwards"] > 0 and stats["stale_lookups"] > 0
    # ZeRO-3's reduce-scatter and DDP's all-reduce sum two ranks' gradients: the same result, bit for bit here.
    assert _close_weights(ranks[0]["weights"], ddp_stale[0]["weights"])
    assert ranks[0]["store"]["losses"].equal(ddp_stale[0]["store"]["losses"])


@needs_deepspeed
def test_zero3_resumes_exactly(zero3_stale, tmp_path):
    out, finished = zero3_stale
    checkpoint = out / "trainer" / f"checkpoint-{RESUME_STEP}"
    assert (checkpoint / "sb_state.pt").exists() and (checkpoint / "latest").exists()  # beside DeepSpeed's own
    resumed = launch(tmp_path, [*STALE, "--zero", "3", "--resume", str(checkpoint)])
    assert resumed[0]["global_step"] == finished[0]["global_step"]
    for theirs, ours in zip(finished, resumed, strict=True):
        assert _same_weights(ours["weights"], theirs["weights"])
        assert ours["store"]["losses"].equal(theirs["store"]["losses"])
        assert ours["stats"]["kept"] == theirs["stats"]["kept"]


@needs_deepspeed
def test_zero2_stale_sb_trains_as_ddp(tmp_path, ddp_stale):
    ranks = launch(tmp_path, [*STALE, "--zero", "2"])
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    # ZeRO-2 reduces gradients in its own buckets: equal to DDP's up to float rounding.
    assert _close_weights(ranks[0]["weights"], ddp_stale[0]["weights"])


@needs_deepspeed
@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("strategy", [KATH18, RHOLOSS], ids=["kath18", "rholoss"])
def test_presampling_and_reference_strategies_keep_ranks_in_lockstep(tmp_path, stage, strategy):
    ranks = launch(tmp_path, [*strategy, "--zero", str(stage)])
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert sum(r["stats"]["selection_forwards"] for r in ranks) > 0


@needs_deepspeed
def test_zero3_loads_the_reference_model_whole_and_checks_no_partitioned_model(tmp_path):
    """A ZeRO-3 config partitions every model from_pretrained loads: the trained model (as the scripts load it), whose
    construction check and reference pass's first-batch check are then skipped with the reason in the log, and,
    unless loaded whole, the --sb_reference_model that each rank runs alone."""
    save_pretrained_pair(tmp_path / "pretrained")
    out = tmp_path / "run"
    code, output = run(out, ["--text", "--pretrained", str(tmp_path / "pretrained"), "--strategy", "rholoss", "--keep",
                             "0.5", "--examples", "32", "--batch", "4", "--epochs", "1", "--zero", "3"])
    assert code == 0, output[-4000:]
    ranks = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    partitioned = "its weights are partitioned by DeepSpeed ZeRO-3"
    assert (f"is not checked against BertForSequenceClassification's own loss when the trainer is built: "
            f"{partitioned}") in output
    assert f"its logits are not compared with those of the model being trained before scoring: {partitioned}" in output
    assert ranks[0]["sb_stats"]["reference_forwards"] == 32
    irreducible = [rank["irreducible"] for rank in ranks]
    assert torch.isfinite(irreducible[0]).all() and torch.equal(irreducible[0], irreducible[1])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])


def test_fsdp2_ranks_scoring_different_rows_stay_in_lockstep(tmp_path):
    ranks = launch(tmp_path, [], worker=FSDP_WORKER)
    assert _same_weights(ranks[0]["weights"], ranks[1]["weights"])
    # Rank 0 scored every row it read (never-scored ids); rank 1 looked all of its up, or had them planned,
    # and ran one forward for each of rank 0's: 3 batches of a stale epoch and 2 of a planned one.
    assert ranks[0]["stats"]["selection_forwards"] == 40 and ranks[0]["stats"]["lockstep_forwards"] == 0
    assert ranks[1]["stats"]["selection_forwards"] == 0 and ranks[1]["stats"]["lockstep_forwards"] == 5
    assert _same_nan(ranks[0]["store"]["losses"], ranks[1]["store"]["losses"])  # NaN: ids never scored


def test_fsdp2_without_lockstep_forwards_fails(tmp_path):
    """The control: the same run with the engine's lockstep forwards off does not finish."""
    # Silent until it ends (6 s on an idle machine): 45 s without output, times the machine's slowness, is its hang.
    code, output = run(tmp_path, ["--no-lockstep"], worker=FSDP_WORKER, quiet=45)
    # It hangs, or gloo finds the ranks' all-gathers of different sizes; any other failure is not this one.
    assert code is None or (code != 0 and "collective mismatch" in output), output[-2000:]
    assert not list(Path(tmp_path).glob("rank*.pt"))
