"""One process of a small multi-process SelectiveBackpropTrainer run.

Launched by ``tests/test_distributed.py`` through ``torchrun`` / ``accelerate launch`` (or
plainly, for one process). Trains a tiny MLP on synthetic data built from a fixed seed, then
writes what the test compares between ranks to ``<out>/rank{rank}.pt``.

Loss modes (``--loss``), all through ``per_example_loss_func``:

- ``ce``: per-example cross-entropy, the model's own loss.
- ``uneven``: cross-entropy plus 100 on rank 1 only, so rank 1 keeps nearly every example and
  rank 0 few: the ranks' queues fill at very different rates.
- ``id``: labels encode the example id (``label = id * CLASSES + class``) and the per-example
  loss is a known function of the id, ``id_loss(id)``: a stored loss can be checked against
  the example it is stored for.
- ``id-nan``: as ``id``, but NaN for the ids in ``NAN_IDS``: those are never kept nor stored, so a
  Stale-SB epoch scores them again, on whichever rank reads them.

``--augment`` collates batches through `AugmentingCollator`, which draws random crops and flips
from a generator of its own on each rank (a resumed run must restore it to continue exactly).
``--images`` trains a small conv net with BatchNorm and dropout (`tiny.TinyConv`) on tiny images that
the dataset itself augments, as ``scripts/train.py`` serves CIFAR (`tiny.make_image_dataset`), with
the cross-entropy of its logits: selection then depends on each rank's BatchNorm statistics.
``--text`` trains a tiny BERT classifier instead, on tokenized sentences of 3 to 32 tokens padded
by `DataCollatorWithPadding`, with the model's own loss (``--loss`` is ignored); with ``--pretrained DIR`` the model
is loaded with ``from_pretrained`` and scored against ``--sb_reference_model DIR/reference`` (`save_pretrained_pair`).
``--check-collectives`` records every collective of the run and compares the ranks' records
(`collective_log.CollectiveLog`); `run` is the training itself, which `tests/collective_worker.py` repeats.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import warnings

import torch
import torch.nn.functional as F
import user_strategy  # noqa: F401  (registers --sb_strategy easiest, defined outside the package; beside this file)
from collective_log import CollectiveLog
from datasets import Dataset
from text_tiny import NEGATIVE, POSITIVE, bert_config, word_tokenizer
from tiny import TinyConv, make_image_dataset
from torch import nn
from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer
from worker_exit import exit_after_results

from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.data import BatchTransform
from hf_selective_backprop.engine import SelectionEngine
from hf_selective_backprop.trainer import WEIGHT_KEY

CLASSES = 4
FEATURES = 8
NAN_IDS = (5, 77)


def id_loss(ids: torch.Tensor) -> torch.Tensor:
    """A loss that is a known, non-monotone function of the example id (exact in float32)."""
    return ((ids.long() * 37) % 101).float() / 8.0


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))

    def forward(self, x, labels=None, num_items_in_batch=None, **kwargs):
        # Takes loss kwargs like transformers' models: the Trainer then passes the step's item
        # count summed over ranks and scales the loss by the number of processes.
        logits = self.net(x)
        outputs = {"logits": logits}
        if labels is not None:
            losses = F.cross_entropy(logits, labels % CLASSES, reduction="none")
            outputs["loss"] = losses.sum() / num_items_in_batch if num_items_in_batch is not None else losses.mean()
        return outputs


def make_dataset(n: int, encode_ids: bool) -> Dataset:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, FEATURES, generator=generator)
    w = torch.randn(FEATURES, CLASSES, generator=generator)
    labels = (x @ w).argmax(1)
    noisy = torch.rand(n, generator=generator) < 0.3
    labels[noisy] = torch.randint(CLASSES, (int(noisy.sum()),), generator=generator)
    if encode_ids:
        labels = torch.arange(n) * CLASSES + labels
    return Dataset.from_dict({"x": x.tolist(), "labels": labels.tolist()}).with_format("torch")


def make_text_dataset(n: int):
    """``n`` reviews of 1 to 6 phrases (label: which list they come from), tokenized unpadded."""
    tokenizer = word_tokenizer(POSITIVE + NEGATIVE)
    draw = random.Random(1234)
    labels = [i % 2 for i in range(n)]
    texts = [" ".join(draw.choice(POSITIVE if label else NEGATIVE) for _ in range(draw.randint(1, 6)))
             for label in labels]
    dataset = Dataset.from_dict({"text": texts, "labels": labels})
    dataset = dataset.map(lambda rows: tokenizer(rows["text"], truncation=True), batched=True, remove_columns="text")
    return dataset, tokenizer


class AugmentingCollator:
    """Stacks rows and augments ``x`` seen as a one-channel 2 x 4 uint8 image (random crop and flip)."""

    def __init__(self, seed: int):
        self.transform = BatchTransform((0.5,), (0.25,), augment=True, crop_padding=1, hflip=True, seed=seed)

    def __call__(self, rows):
        batch = {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
        pixels = ((batch["x"].clamp(-4, 4) + 4) * 31).to(torch.uint8).reshape(-1, 1, 2, 4)
        batch["x"] = self.transform(pixels).flatten(1)
        return batch

    def state_dict(self):
        return self.transform.state_dict()

    def load_state_dict(self, state):
        self.transform.load_state_dict(state)


def make_loss_func(mode: str, rank: int):
    def per_example_loss(outputs, labels):
        if mode in ("id", "id-nan"):
            ids = torch.div(labels, CLASSES, rounding_mode="floor")
            losses = id_loss(ids)
            if mode == "id-nan":
                losses[torch.isin(ids, torch.tensor(NAN_IDS, device=ids.device))] = float("nan")
            return losses.to(labels.device)
        losses = F.cross_entropy(outputs["logits"].float(), labels % CLASSES, reduction="none")
        if mode == "uneven" and rank == 1:
            losses = losses + 100.0
        return losses

    return per_example_loss


class RecordingEngine(SelectionEngine):
    """Records what each rank fed its strategy and read, and what a resume restored."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.selection_losses = []  # losses each strategy call selected from, in order
        self.reads = []  # (epoch, ids) of each selection batch read
        self.restored = None
        select = self.selector.select

        def recording_select(losses, generator, population=None):
            self.selection_losses.append(losses.detach().cpu().clone())
            return select(losses, generator, population)

        self.selector.select = recording_select

    def add_batch(self, batch, selecting, model):
        self.reads.append((self.epoch, batch[self.index_column].cpu().clone()))
        return super().add_batch(batch, selecting, model)

    def begin_epoch(self, epoch, num_epochs, epoch_based):
        if self.resumed_position is not None and self.restored is None:
            epoch, plan, rows = self.resumed_position
            self.restored = {
                "selector": self.selector.state_dict(),
                "store": self.store.state_dict(),
                "epoch": epoch,
                "skip": rows // (self.selection_batch_size * self.accelerator.num_processes),
                "queue": len(self.queue),
                # The ids the resumed epoch loads at all (every id without a plan made before loading).
                "planned": None if plan is None else (plan.loads(torch.arange(len(plan.copies))) > 0).nonzero(),
            }
        super().begin_epoch(epoch, num_epochs, epoch_based)


class RecordingTrainer(SelectiveBackpropTrainer):
    engine_class = RecordingEngine


def _reference() -> TinyMLP:
    """Another initialisation, drawn without touching the run's own random state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return TinyMLP()


def weighted_loss_check(trainer, dataset, rank: int) -> dict:
    """The loss with all-one selection weights next to the model's own loss on the same rows.

    Both get the item count of the (here 4-row) batches of all ranks, as in a real step.
    """
    device = trainer.args.device
    rows = dataset[4 * rank : 4 * rank + 4]
    inputs = {"x": rows["x"].to(device), "labels": rows["labels"].to(device)}
    num_items = trainer._get_num_items_in_batch([inputs], device)  # a collective, on every rank
    module = trainer.accelerator.unwrap_model(trainer.model_wrapped).train()
    trainer.per_example_loss_func = make_loss_func("ce", rank)
    with torch.no_grad():
        reference = Trainer.compute_loss(trainer, module, dict(inputs), num_items_in_batch=num_items)
        weights = torch.ones(4, device=device)
        weighted = trainer.compute_loss(module, {**inputs, WEIGHT_KEY: weights}, num_items_in_batch=num_items)
    return {"reference": float(reference), "weighted": float(weighted), "num_items": float(num_items)}


def deepspeed_config(stage: int) -> dict:
    """ZeRO at ``stage`` in float32, the Trainer's batch sizes and optimizer ("auto")."""
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }


def full_weights(trainer) -> dict:
    """The model's whole weights on every rank: under ZeRO-3 and FSDP each rank holds a shard until gathered."""
    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    if not trainer.is_deepspeed_enabled:
        # FSDP2 holds each weight as a DTensor sharded over the ranks.
        return {k: getattr(v, "full_tensor", lambda v=v: v)().detach().cpu().clone()
                for k, v in trainer.model.state_dict().items()}
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def save_pretrained_pair(folder) -> None:
    """A tiny BERT classifier to train (``folder/model``) and another as its RHO-LOSS reference
    (``folder/reference``), saved as ``save_pretrained`` writes them, for ``--pretrained folder``."""
    _, tokenizer = make_text_dataset(8)
    config_of_model = bert_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    for name, seed in (("model", 0), ("reference", 1)):
        torch.manual_seed(seed)
        BertForSequenceClassification(config_of_model).save_pretrained(os.path.join(folder, name))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for rank{rank}.pt and the Trainer's output_dir")
    parser.add_argument("--loss", choices=["ce", "uneven", "id", "id-nan"], default="ce")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--keep", type=float, default=1 / 3)
    parser.add_argument("--strategy", default="sb", help="any --sb_strategy, or 'easiest' (tests/user_strategy.py)")
    parser.add_argument("--history", type=int, default=1024)
    parser.add_argument("--scope", choices=["global", "local"], default="global")
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--interrupt", type=int, default=0, help="--sb_interrupt (no epoch is planned then)")
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--drop-last", action="store_true", help="dataloader_drop_last")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--text", action="store_true", help="a tiny BERT on padded sentences of varying length")
    parser.add_argument("--pretrained", default=None,
                        help="with --text: train DIR/model (from_pretrained) against --sb_reference_model "
                             "DIR/reference (save_pretrained_pair)")
    parser.add_argument("--reference", action="store_true", help="'rholoss': a second TinyMLP as reference model")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one GPU per process (NCCL)")
    parser.add_argument("--images", action="store_true", help="a conv net with BatchNorm on augmented tiny images")
    parser.add_argument("--zero", type=int, choices=[1, 2, 3], default=None, help="DeepSpeed ZeRO stage")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 full sharding (CUDA: on the CPU it runs as DDP)")
    parser.add_argument("--split-batches", action="store_true", help="accelerator_config split_batches=True")
    parser.add_argument("--budget", type=float, default=None, help="--sb_budget")
    parser.add_argument("--uneven-batches", action="store_true", help="accelerator_config even_batches=False")
    parser.add_argument("--check-collectives", action="store_true",
                        help="record every collective (tests/collective_log.py) and compare the ranks' records")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """Train as ``args`` say; what the tests compare between ranks."""
    rank = int(os.environ.get("RANK", "0"))
    config = SelectiveBackpropConfig(
        output_dir=os.path.join(args.out, "trainer"),
        use_cpu=args.device == "cpu",
        seed=0,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=args.epochs,
        learning_rate=0.05,
        lr_scheduler_type="constant",
        logging_steps=2,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_drop_last=args.drop_last,
        sb_strategy=args.strategy,
        sb_keep=args.keep,
        sb_history_size=args.history,
        sb_history_scope=args.scope,
        sb_staleness=args.staleness,
        sb_interrupt=args.interrupt,
        sb_budget=args.budget,
        sb_reference_model=os.path.join(args.pretrained, "reference") if args.pretrained else None,
        deepspeed=deepspeed_config(args.zero) if args.zero else None,
        fsdp="full_shard" if args.fsdp else None,
        fsdp_config={"version": 2} if args.fsdp else None,
        accelerator_config={"split_batches": args.split_batches, "even_batches": not args.uneven_batches},
    )
    torch.manual_seed(0)
    if args.text:
        dataset, tokenizer = make_text_dataset(args.examples)
        if args.pretrained:  # after the config: under a ZeRO-3 one, from_pretrained partitions the model
            model = BertForSequenceClassification.from_pretrained(os.path.join(args.pretrained, "model"))
        else:
            config_of_model = bert_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
            model = BertForSequenceClassification(config_of_model)
        collator, loss_func = DataCollatorWithPadding(tokenizer), None
    elif args.images:
        model, dataset = TinyConv(batch_norm=True), make_image_dataset(args.examples)
        collator, loss_func = None, make_loss_func(args.loss, rank)
    else:
        model = TinyMLP()
        dataset = make_dataset(args.examples, encode_ids=args.loss.startswith("id"))
        collator = AugmentingCollator(seed=rank) if args.augment else None
        loss_func = make_loss_func(args.loss, rank)
    trainer = RecordingTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        data_collator=collator,
        per_example_loss_func=loss_func,
        reference_model=_reference() if args.reference else None,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(resume_from_checkpoint=args.resume)
    assert rank == trainer.args.process_index

    result = {
        "rank": rank,
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "weights": full_weights(trainer),
        "global_step": trainer.state.global_step,
        "warnings": [str(w.message) for w in caught],
        "augmentation": collator.transform.generator.get_state() if args.augment else None,
    }
    if args.images:
        result["augmentation"] = dataset.transform.generator.get_state()
    if trainer.selector is None:  # --strategy none: the Trainer's run, without an engine
        return result
    history = getattr(trainer.selector, "history", None)
    irreducible = trainer.engine.irreducible
    result |= {
        "selector_state": trainer.selector.state_dict(),
        "history": history.values() if history is not None else None,
        "store": trainer.engine.store.state_dict(),
        "labels": None if trainer.engine.labels is None else trainer.engine.labels.labels,
        "queue": len(trainer.engine.queue),
        "stats": trainer.engine.stats.state_dict(),
        "sb_stats": trainer.sb_stats,
        "selection_losses": trainer.engine.selection_losses,
        "read": trainer.engine.reads,
        "restored": trainer.engine.restored,
        "selection_batches_per_epoch": trainer._run_length.selection_batches_per_epoch,
        "rows_per_epoch": trainer._run_length.rows_per_epoch,
        "irreducible": None if irreducible is None else irreducible.losses,
        "budget": None if trainer.engine.budget is None else trainer.engine.budget.state_dict(),
        "budget_spent": trainer.engine.budget_spent,
    }
    if not (args.text or args.images):
        result["weighted_loss"] = weighted_loss_check(trainer, dataset, rank)  # after the store is copied
    return result


def main() -> None:
    args = parse_args()
    log = CollectiveLog(torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}") if args.device == "cuda" else "cpu")
    if args.check_collectives:
        log.install()
    result = run(args)
    if args.check_collectives:
        result["collectives"] = log.compare()
    rank = result["rank"]
    os.makedirs(args.out, exist_ok=True)
    torch.save(result, os.path.join(args.out, f"rank{rank}.pt"))
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in result["weights"].values())).hexdigest()
    print(
        f"rank {rank}/{result['world_size']} {result['distributed_type']} backend="
        f"{torch.distributed.get_backend() if torch.distributed.is_initialized() else None} "
        f"global_step={result['global_step']} kept={result.get('stats', {}).get('kept')} queue={result.get('queue')} "
        f"weights_sha256={digest[:16]}",
        flush=True,
    )
    exit_after_results()


if __name__ == "__main__":
    main()
