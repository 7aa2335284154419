"""What only a CUDA device can show (marked ``gpu``: collected and skipped without one; `make gpu-check` runs them).

docs/benchmarks/gpu.md says where they last ran.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from launch import launch, run, watched
from test_streams import write_parquet
from tiny import TinyClassifier, TinyConv, make_config, make_dataset, make_image_dataset
from transformers.trainer_utils import get_last_checkpoint

from hf_selective_backprop import SelectiveBackpropTrainer, losses, record
from hf_selective_backprop.engine import transfer

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def cuda_syncs(fn) -> list[str]:
    """Where ``fn`` made the host wait for the device (torch.cuda.set_sync_debug_mode), as 'file:line'."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def cuda_config(output_dir, **overrides):
    return make_config(output_dir, use_cpu=False, **overrides)


def test_to_device_does_not_wait_and_to_host_waits_once():
    host = torch.arange(1000)
    # The first pinned copy of a process waited once on the H200 run of 2026-11-24 (the pinned-memory
    # allocator starting up); what matters is every copy after it.
    transfer.to_device(torch.arange(10), "cuda")
    assert cuda_syncs(lambda: transfer.to_device(host, "cuda")) == []
    on_device = transfer.to_device(host, "cuda")
    assert on_device.is_cuda and torch.equal(on_device.cpu(), host)
    tensors = (on_device, on_device.float() / 3, on_device > 500)
    copied = []
    assert len(cuda_syncs(lambda: copied.extend(transfer.to_host(*tensors)))) == 1
    for original, back in zip(tensors, copied, strict=True):
        assert back.device.type == "cpu" and back.dtype == original.dtype and torch.equal(back, original.cpu())


def test_to_host_copies_the_device_tensors_once_and_leaves_host_ones(tmp_path):
    # Stale RHO-LOSS on CUDA crashed here: ids the collator left on the host beside losses on the device.
    ids, losses = torch.arange(8), torch.linspace(0, 1, 8, device="cuda")
    copied = []
    assert len(cuda_syncs(lambda: copied.extend(transfer.to_host(ids, losses)))) == 1
    assert [t.device.type for t in copied] == ["cpu", "cpu"]
    assert torch.equal(copied[0], ids) and torch.equal(copied[1], losses.cpu())


def test_a_dataset_held_on_the_gpu_augments_as_on_the_host_and_trains_with_its_record(output_dir):
    host, held = make_image_dataset(64), make_image_dataset(64).to("cuda")  # two generators, one seed
    positions = list(range(0, 64, 3))
    for on_host, on_device in zip(host.__getitems__(positions), held.__getitems__(positions), strict=True):
        assert on_device["pixel_values"].is_cuda and on_device["labels"].is_cuda
        assert not on_device["index"].is_cuda  # ids stay where selection and the record key examples by them
        torch.testing.assert_close(on_device["pixel_values"].cpu(), on_host["pixel_values"])
        assert on_device["labels"].item() == on_host["labels"].item() and on_device["index"] == on_host["index"]
    assert held.fingerprint() == host.fingerprint()
    held.__getitems__(positions)  # the first pinned copy of a process may wait once (see the test above)
    assert cuda_syncs(lambda: held.__getitems__(positions)) == []  # gathered and augmented without a wait
    trainer = SelectiveBackpropTrainer(
        model=TinyConv(), args=cuda_config(output_dir, dataloader_pin_memory=False, sb_keep=0.5),
        train_dataset=make_image_dataset(64).to("cuda"),
    )
    trainer.train()
    assert trainer.sb_stats["backwards"] > 0
    assert sorted(record.load_record(output_dir)["index"]) == list(range(64))


@pytest.mark.parametrize("staleness", [1, 3])
def test_rholoss_trains_on_cuda_fresh_and_stale(output_dir, staleness):
    dataset = make_dataset(96)
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), reference_model=TinyClassifier(seed=2),
        args=cuda_config(output_dir, sb_strategy="rholoss", sb_keep=0.5, sb_staleness=staleness, num_train_epochs=4),
        train_dataset=dataset,
    )
    trainer.train()
    stats = trainer.sb_stats
    assert stats["reference_forwards"] == 96 and stats["backwards"] > 0
    assert (stats["stale_lookups"] > 0) == (staleness > 1)


def test_a_selection_batch_waits_for_the_device_once(output_dir, monkeypatch):
    # losses.check_class_labels validates labels with bool(): one more wait per per-example loss (docs/gpu.md).
    monkeypatch.setattr(losses, "check_class_labels", lambda *args, **kwargs: None)
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), args=cuda_config(output_dir, sb_strategy="sb", sb_keep=0.5),
        train_dataset=make_dataset(64),
    )
    model = trainer.model.cuda()
    batch = {k: v.cuda() for k, v in trainer.train_dataset[:16].items()}
    engine = trainer.engine
    assert len(cuda_syncs(lambda: engine.add_batch(batch, True, model))) == 1
    for _ in range(3):
        engine.add_batch(batch, True, model)
    assert cuda_syncs(lambda: engine.next_step(torch.device("cuda"))) == []


class DtypeRecorder(TinyClassifier):
    def __init__(self):
        super().__init__()
        self.eval_dtypes = set()
        self.net[0].register_forward_hook(lambda module, args, output: self._record(output))

    def _record(self, output):
        if not self.training:
            self.eval_dtypes.add(output.dtype)


@pytest.mark.parametrize(
    ("training", "selection", "expected"),
    [("bf16", "auto", torch.bfloat16), ("bf16", "fp32", torch.float32), ("fp16", "bf16", torch.bfloat16),
     ("fp16", "auto", torch.float16)],
)
def test_selection_forward_runs_in_the_chosen_precision(output_dir, training, selection, expected):
    model = DtypeRecorder()
    args = cuda_config(
        output_dir, num_train_epochs=1, logging_steps=1, sb_selection_precision=selection, **{training: True}
    )
    trainer = SelectiveBackpropTrainer(model=model, args=args, train_dataset=make_dataset(64))
    # The construction check's forward runs in fp32, before Accelerate patches autocast in (as on the CPU in
    # test_gpu_hazards); the H200 run of 2026-11-24 counted it and failed for 'auto'.
    model.eval_dtypes.clear()
    trainer.train()
    assert model.eval_dtypes == {expected}
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert logged and all(torch.isfinite(torch.tensor(logged)))


def _final(trainer) -> dict:
    return {
        "weights": {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()},
        "step": trainer.state.global_step,
        "store": trainer.engine.store.state_dict(),
        "queue": trainer.engine.queue.state_dict(),
        "generator": trainer.engine.generator.get_state(),
        "augmentation": trainer.train_dataset.transform.generator.get_state(),
    }


def test_resume_on_cuda_continues_bit_for_bit(output_dir):
    # Dropout draws from the CUDA generator: a resumed run matches only if the checkpoint restores it.
    settings = dict(
        sb_strategy="sb", sb_beta=1.0, sb_staleness=2, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        sb_selection_batch_size=6, num_train_epochs=3, save_strategy="steps", save_steps=1, full_determinism=True,
    )
    # full_determinism sets process-wide switches (deterministic algorithms, cuDNN, environment): undone below.
    environment = dict(os.environ)
    try:
        reference = SelectiveBackpropTrainer(
            model=TinyConv(), args=cuda_config(output_dir, **settings), train_dataset=make_image_dataset(96)
        )
        reference.train()
        expected = _final(reference)
        checkpoints = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        middle = checkpoints[len(checkpoints) // 2]
        assert "cuda" in torch.load(middle / "rng_state.pth", weights_only=False)
        resumed = SelectiveBackpropTrainer(
            model=TinyConv(), args=cuda_config(output_dir + "-resumed", **settings),
            train_dataset=make_image_dataset(96),
        )
        resumed.train(resume_from_checkpoint=str(middle))
        got = _final(resumed)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
        os.environ.clear()
        os.environ.update(environment)
    assert got["step"] == expected["step"]
    for name, value in expected["weights"].items():
        assert torch.equal(got["weights"][name], value), name
    assert torch.equal(got["store"]["losses"].nan_to_num(-1), expected["store"]["losses"].nan_to_num(-1))
    assert got["queue"]["rows"].keys() == expected["queue"]["rows"].keys()
    for name, rows in expected["queue"]["rows"].items():
        assert torch.equal(got["queue"]["rows"][name], rows), name
    assert torch.equal(got["generator"], expected["generator"])
    assert torch.equal(got["augmentation"], expected["augmentation"])
    assert get_last_checkpoint(output_dir + "-resumed") is not None


two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


def _same_collectives(ranks: list[dict]) -> None:
    """Every rank issued the same collectives, of the same shapes, every tensor on its GPU (--check-collectives)."""
    report = ranks[0]["collectives"]
    assert report["first_difference"] is None, report["first_difference"]
    assert [rank["collectives"]["misplaced"] for rank in ranks] == [[], []]


def _same_weights(ranks: list[dict]) -> bool:
    return all(torch.equal(value, ranks[1]["weights"][name]) for name, value in ranks[0]["weights"].items())


def _same_irreducible(ranks: list[dict], rows: int) -> None:
    """Every rank holds every example's irreducible loss, scored once by the ranks together."""
    assert ranks[0]["sb_stats"]["reference_forwards"] == rows
    table = ranks[0]["irreducible"]
    assert table.numel() == rows and torch.isfinite(table).all() and torch.equal(table, ranks[1]["irreducible"])


@two_gpus
def test_two_processes_stay_in_lockstep_under_nccl(tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "tests" / "dist_worker.py"), "--out", str(tmp_path), "--device", "cuda", "--loss", "uneven",
        "--staleness", "2", "--epochs", "3", "--check-collectives",
    ]
    code, output = watched(command)
    assert code == 0, output[-6000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert "backend=nccl" in output
    _same_collectives(ranks)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    # Rank 1's losses are shifted up, so it keeps more, yet both ranks stepped together.
    assert ranks[1]["stats"]["kept"] > ranks[0]["stats"]["kept"]
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(value, ranks[1]["weights"][name]), name
    assert torch.equal(ranks[0]["store"]["losses"].nan_to_num(-1), ranks[1]["store"]["losses"].nan_to_num(-1))


def _nccl(out, args: list[str]) -> list[dict]:
    """tests/dist_worker.py on two GPUs, one process each, every collective recorded."""
    ranks = launch(out, ["--device", "cuda", "--check-collectives", *args])
    _same_collectives(ranks)
    return ranks


@two_gpus
def test_two_gpus_rholoss_reference_pass_ends_together(tmp_path):
    """67 rows in reference batches of 8, even_batches=False: the pass reads 5 batches on rank 0, 4 on rank 1."""
    ranks = _nccl(tmp_path, ["--strategy", "rholoss", "--reference", "--keep", "0.5", "--examples", "67",
                             "--batch", "4", "--uneven-batches"])
    _same_irreducible(ranks, 67)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0 and _same_weights(ranks)


GPU_STALE = ["--loss", "id", "--staleness", "2", "--scope", "local", "--epochs", "4", "--batch", "4", "--grad-accum",
             "2", "--save-steps", "7"]


@two_gpus
def test_two_gpus_save_a_checkpoint_and_resume_it(tmp_path):
    """Stale-SB with losses that are a function of the id (selection does not depend on float rounding): a run
    resumed from step 7, inside a stale epoch, ends as the uninterrupted run."""
    finished = _nccl(tmp_path / "finished", GPU_STALE)
    checkpoint = tmp_path / "finished" / "trainer" / "checkpoint-7"
    assert {"sb_state.pt", "sb_rank_state_0.pt", "sb_rank_state_1.pt"} <= {p.name for p in checkpoint.iterdir()}
    resumed = _nccl(tmp_path / "resumed", [*GPU_STALE, "--resume", str(checkpoint)])
    for theirs, ours in zip(finished, resumed, strict=True):
        assert ours["global_step"] == theirs["global_step"] > 7
        assert ours["restored"]["epoch"] == 1  # a stale epoch
        assert torch.equal(ours["store"]["losses"].nan_to_num(-1), theirs["store"]["losses"].nan_to_num(-1))
        counters = ("examples_seen", "kept", "backwards", "selection_forwards", "stale_lookups")
        assert {k: ours["stats"][k] for k in counters} == {k: theirs["stats"][k] for k in counters}
        for name, value in theirs["weights"].items():
            torch.testing.assert_close(ours["weights"][name], value)
    assert _same_weights(resumed)


@two_gpus
def test_two_gpus_end_a_budget_run_at_the_same_step(tmp_path):
    ranks = _nccl(tmp_path, ["--strategy", "sb", "--budget", "0.5", "--epochs", "4", "--examples", "128"])
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0 and _same_weights(ranks)
    assert ranks[0]["budget_spent"] == ranks[1]["budget_spent"] > 0  # summed over ranks: one figure
    assert ranks[0]["budget"] == ranks[1]["budget"]


@two_gpus
@pytest.mark.parametrize("mode", ["first", "strategies"])
def test_two_gpus_stream_their_shares(tmp_path, mode):
    """Each rank streams its share: Stale-SB with its stored losses looked up batch by batch ("first"), InfoBatch
    deciding rows from the store, and RHO-LOSS scoring each share with the reference ("strategies")."""
    out = tmp_path / mode
    out.mkdir()
    ranks = launch(out, ["--data", write_parquet(tmp_path, rows=64), "--mode", mode, "--device", "cuda"],
                   worker=ROOT / "tests" / "stream_worker.py")
    _same_collectives(ranks)
    runs = [(rank["params"],) for rank in ranks] if mode == "first" else [
        (rank["infobatch"]["params"], rank["rholoss"]["params"]) for rank in ranks]
    for ours, theirs in zip(*runs, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    if mode == "strategies":
        irreducible = [rank["rholoss"]["irreducible"] for rank in ranks]
        assert irreducible[0].numel() == 64 and torch.equal(irreducible[0], irreducible[1])


@two_gpus
@pytest.mark.parametrize("stage, model, unplaced", [
    ("2", ["--reference"], "its weights are on cpu and the rows on cuda"),
    ("3", ["--text", "--pretrained"], "its weights are partitioned by DeepSpeed ZeRO-3"),
], ids=["zero2", "zero3"])
def test_two_gpus_rholoss_under_deepspeed(tmp_path, stage, model, unplaced):
    """The reference pass runs before DeepSpeed places the trained model: on the host (ZeRO-2), or partitioned
    (ZeRO-3, loaded with from_pretrained under the config), so its first-batch check is skipped with the reason in
    the log; --sb_reference_model comes back whole under ZeRO-3, and each rank scores its share with it."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    from dist_worker import save_pretrained_pair

    if "--pretrained" in model:
        save_pretrained_pair(tmp_path / "pretrained")
        model = [*model, str(tmp_path / "pretrained")]
    args = ["--device", "cuda", "--check-collectives", "--strategy", "rholoss", "--keep", "0.5", "--examples", "64",
            "--batch", "4", "--zero", stage, *model]
    code, output = run(tmp_path / "run", args)
    assert code == 0, output[-4000:]
    assert f"its logits are not compared with those of the model being trained before scoring: {unplaced}" in output
    ranks = [torch.load(tmp_path / "run" / f"rank{rank}.pt", weights_only=False) for rank in (0, 1)]
    _same_collectives(ranks)
    _same_irreducible(ranks, 64)
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0 and _same_weights(ranks)


SHARDED_STALE = ["--device", "cuda", "--strategy", "sb", "--staleness", "2", "--loss", "id", "--epochs", "4",
                 "--examples", "67", "--batch", "4", "--drop-last", "--check-collectives"]


@pytest.mark.parametrize("sharding", [["--fsdp"], ["--zero", "3"]], ids=["fsdp2", "zero3"])
def test_sharded_stale_sb_through_the_trainer_on_cuda(tmp_path, sharding):
    """FSDP2 and ZeRO-3 through the Trainer, one process per GPU (up to two): ranks in lockstep, equal weights."""
    if sharding[0] == "--zero":
        pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    processes = min(torch.cuda.device_count(), 2)
    ranks = launch(tmp_path, [*SHARDED_STALE, *sharding], processes=processes)
    expected = "DistributedType.FSDP" if sharding[0] == "--fsdp" else "DistributedType.DEEPSPEED"
    assert [r["distributed_type"] for r in ranks] == [expected] * processes
    assert ranks[0]["collectives"]["first_difference"] is None and not any(r["collectives"]["misplaced"] for r in ranks)
    assert ranks[0]["global_step"] > 0
    for rank in ranks[1:]:
        assert rank["weights"].keys() == ranks[0]["weights"].keys()
        assert all(torch.equal(rank["weights"][k], v) for k, v in ranks[0]["weights"].items())
