"""What the example record (--sb_record) costs a training step, measured side by side with it off.

    python benchmarks/bench_record.py [--workloads image,text,sft] [--repeats 4] [--threads 2]

Each workload trains from the same seed with the record off and on, in pairs whose order alternates (off then on,
then on then off), so that a drift of the machine's speed falls on both; a run's step time is the mean over its
steps after the first ``--warmup`` (two epoch ends, where the record gathers its events, fall inside that window).
The table gives each pair's overhead (on / off - 1), their median and range, and the one-time cost of writing the
table and data map for ``--write_examples`` examples at the end of a run. Two runs' step times differ by a few
percent from run to run whatever they do, so each run with the record on also clocks the time spent inside the
record's own calls (the events it buffers and the flushes that apply them), in the margins computed only for it
and, in a run without selection, in the per-example loss computed only for it: on a CPU, where every call runs to
its end before returning, that is the record's cost per step, free of the spread between runs. Synthetic inputs of
the workloads' shapes: a step's cost does not depend on the pixel or token values. Timing is the point: run it on
an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel, TrainerCallback

from harness.provenance import provenance
from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
from hf_selective_backprop.record.files import write_record
from hf_selective_backprop.record.keeper import RecordKeeper
from hf_selective_backprop.record.table import TRAINED, ExampleRecord

#: workload -> (strategies timed, batch size, steps per epoch)
WORKLOADS = {"image": (("none", "sb"), 128, 30), "text": (("none",), 32, 30), "sft": (("none",), 16, 30)}


class RecordClock:
    """Seconds spent inside RecordKeeper's calls that training makes (scored, trained, flush), while installed, and
    inside what ``trainer``'s per-example loss computes for the record alone: its margins (`ExampleLoss.margins`),
    and in a run without selection the loss itself (selection computes it anyway)."""

    CALLS = ("scored", "trained", "flush")

    def __init__(self, trainer=None):
        self.seconds = 0.0
        self._originals = {name: getattr(RecordKeeper, name) for name in self.CALLS}
        self._trainer = trainer

    def __enter__(self):
        for name, original in self._originals.items():
            setattr(RecordKeeper, name, self._timed(original))
        if self._trainer is not None:
            loss = self._trainer.per_example_loss_func
            if hasattr(loss, "margins"):  # an instance attribute: the selection forward's loss is this object too
                loss.margins = self._timed(loss.margins)
            if self._trainer.selector is None:
                timed = self._timed(loss)
                timed.margins = getattr(loss, "margins", None)
                self._trainer.per_example_loss_func = timed
        return self

    def __exit__(self, *exc):
        for name, original in self._originals.items():
            setattr(RecordKeeper, name, original)
        if self._trainer is not None:
            if self._trainer.selector is None:
                self._trainer.per_example_loss_func = self._trainer.per_example_loss_func.original
            vars(self._trainer.per_example_loss_func).pop("margins", None)

    def _timed(self, original):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        timed.original = original
        return timed


class StepClock(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


def _image_parts(rows: int):
    generator = torch.Generator().manual_seed(0)
    data = Dataset.from_dict({
        "pixel_values": torch.randn(rows, 3, 32, 32, generator=generator).numpy(),
        "labels": torch.randint(0, 10, (rows,), generator=generator).tolist(),
    }).with_format("torch")
    return lambda: _seeded_image_model(), data


def _seeded_image_model():
    from hf_selective_backprop.models import ModelArguments, build_model

    torch.manual_seed(0)
    return build_model(ModelArguments(model="cifar_convnet_half"), 10, 32, (0.5,) * 3, (0.25,) * 3)


def _token_parts(rows: int, kind: str):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 1000, (rows, 64), generator=generator)
    if kind == "text":
        columns = {"input_ids": tokens.tolist(), "attention_mask": torch.ones_like(tokens).tolist(),
                   "labels": torch.randint(0, 2, (rows,), generator=generator).tolist()}
        config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=512, max_position_embeddings=64, num_labels=2)
        return lambda: _seeded(BertForSequenceClassification, config), Dataset.from_dict(columns).with_format("torch")
    columns = {"input_ids": tokens.tolist(), "attention_mask": torch.ones_like(tokens).tolist(),
               "labels": tokens.tolist()}
    config = GPT2Config(vocab_size=1000, n_embd=128, n_layer=2, n_head=2, n_positions=64)
    return lambda: _seeded(GPT2LMHeadModel, config), Dataset.from_dict(columns).with_format("torch")


def _seeded(model_class, config):
    torch.manual_seed(0)
    return model_class(config)


def step_seconds(workload: str, strategy: str, record: bool, steps: int, warmup: int, folder: str):
    """A run's mean step time after ``warmup`` steps, and the record's own seconds per step over the whole run."""
    _, batch, per_epoch = WORKLOADS[workload]
    rows = batch * per_epoch
    make_model, data = _image_parts(rows) if workload == "image" else _token_parts(rows, workload)
    args = SelectiveBackpropConfig(
        output_dir=folder, sb_strategy=strategy, sb_record=record, per_device_train_batch_size=batch,
        max_steps=steps, learning_rate=0.01, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=10_000, seed=0, dataloader_num_workers=0,
    )
    clock = StepClock()
    trainer = SelectiveBackpropTrainer(model=make_model(), args=args, train_dataset=data, callbacks=[clock])
    with RecordClock(trainer) as record_clock:
        trainer.train()
    return (clock.ends[-1] - clock.ends[warmup - 1]) / (len(clock.ends) - warmup), record_clock.seconds / steps


def write_seconds(examples: int, folder: str) -> float:
    record = ExampleRecord()
    generator = torch.Generator().manual_seed(0)
    for epoch in range(5):
        ids = torch.randperm(examples, generator=generator)
        losses = torch.rand(examples, generator=generator, dtype=torch.float64) * 3
        record.apply(ids, losses, torch.full_like(ids, TRAINED), torch.full_like(ids, epoch))
    start = time.perf_counter()
    write_record(record, os.path.join(folder, "example_record.parquet"), "index")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="image,text,sft")
    parser.add_argument("--strategies", default="", help="only these of each workload's strategies (none,sb)")
    parser.add_argument("--repeats", type=int, default=4,
                        help="pairs of runs per workload and strategy, off first in even pairs and on first in odd")
    parser.add_argument("--steps", type=int, default=75, help="optimizer steps per run (two and a half epochs)")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write_examples", type=int, default=50_000)
    parser.add_argument("--output", default="benchmarks/results/record-overhead")
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    rows, results = [], []
    with tempfile.TemporaryDirectory() as folder:
        for workload in options.workloads.split(","):
            for strategy in options.strategies.split(",") if options.strategies else WORKLOADS[workload][0]:
                overheads, times, inside = [], {False: [], True: []}, []
                for repeat in range(options.repeats):
                    pair = {}
                    # Alternate which run goes first, so that a drift within a pair falls on both sides.
                    for record in (False, True) if repeat % 2 == 0 else (True, False):
                        seconds, record_seconds = step_seconds(
                            workload, strategy, record, options.steps, options.warmup,
                            os.path.join(folder, f"{workload}-{strategy}-{repeat}-{record}"))
                        pair[record] = seconds
                        times[record].append(seconds)
                        if record:
                            inside.append(record_seconds / seconds)
                    overheads.append(pair[True] / pair[False] - 1)
                    print(f"{workload} {strategy} pair {repeat}: off {pair[False] * 1e3:.1f} ms, "
                          f"on {pair[True] * 1e3:.1f} ms a step ({100 * overheads[-1]:+.2f} %), inside the record "
                          f"{100 * inside[-1]:.3f} % of a step", flush=True)
                results.append({"workload": workload, "strategy": strategy, "off": times[False],
                                "on": times[True], "overheads": overheads, "inside_record": inside})
                rows.append(f"| {workload} | {strategy} | {statistics.median(times[False]) * 1e3:.1f} | "
                            f"{statistics.median(times[True]) * 1e3:.1f} | {100 * statistics.median(overheads):+.2f} % "
                            f"({100 * min(overheads):+.2f} to {100 * max(overheads):+.2f}) | "
                            f"{100 * statistics.median(inside):.3f} % ({100 * min(inside):.3f} to "
                            f"{100 * max(inside):.3f}) |")
        written = write_seconds(options.write_examples, folder)
    report = [
        "# The example record's cost per training step", "",
        f"`{provenance()['command']}` at commit {provenance()['commit']}, {options.threads} torch threads, "
        f"{os.cpu_count()} CPUs. Median over {options.repeats} pairs of runs (off and on, the order alternating) of "
        "each pair's overhead, its range in brackets.", "",
        "| workload | strategy | step, record off (ms) | step, record on (ms) | overhead: median (range) | "
        "inside the record's calls (and the per-example loss it alone asks for), share of a step: median (range) |",
        "|---|---|---|---|---|---|", *rows, "",
        f"Writing the table and data map of {options.write_examples:,} examples at the end of a run: {written:.2f} s.",
    ]
    os.makedirs(options.output, exist_ok=True)
    with open(os.path.join(options.output, "report.md"), "w") as handle:
        handle.write("\n".join(report) + "\n")
    with open(os.path.join(options.output, "results.json"), "w") as handle:
        json.dump({"provenance": provenance(), "results": results, "write_seconds": written}, handle, indent=2)
    print("\n".join(report))


if __name__ == "__main__":
    main()
