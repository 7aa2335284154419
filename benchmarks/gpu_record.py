"""The example record on a GPU: pruning's wall-clock saving beside the cost model's, and the record's overhead
per step (docs/benchmarks/benchmarks.md, "The record and pruning on one H200").

    python benchmarks/gpu_record.py --data DIR --output_dir OUT [--seeds 0 1 2] [--budget_seconds 480]

The image fine-tuning workload of benchmarks/run_record.sh, scaled to a GPU: a timm resnet50 at 128x128 pixels,
pretrained here from scratch on CIFAR-10's classes 0-4 (the stand-in: no Hub downloads), then fine-tuned on classes
5-9, every image decoded once and held on the device (`ImageTensorDataset.to`: batches are gathered and augmented
there, so the host's loader does not bound the step). Per seed, through scripts/train.py's own code path
(`train_image_classifier`, flags parsed as its command line parses them):

- Traditional with the record on (its record scores the examples) and with it off: the record's overhead per
  step (off first in the first seed, last in the others);
- Traditional on the 60 % of the examples that record ranks most variable (the policy that kept Traditional's
  accuracy on the CPU) and on a random 60 % (the control): the second run's wall-clock saving beside the cost
  model's 1 / 0.6 = 1.67x.

Every run's accuracy, steps and training time go to OUT/results.json as it ends; a run that would end after
--budget_seconds (estimated from the runs before it) is skipped, so a lent GPU's time ends with a complete table of
what ran; --overhead_pairs adds more record off/on pairs after the seeds. OUT/report.md renders it, and --merge
renders one report from several calls' results.json. DIR holds `cifar10` in the Hub's layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import HfArgumentParser

from harness.provenance import provenance
from hf_selective_backprop import SelectiveBackpropConfig, workflow
from hf_selective_backprop.data import DataArguments, load_image_data
from hf_selective_backprop.data.transforms import BatchTransform
from hf_selective_backprop.models import ModelArguments
from hf_selective_backprop.workflow import IMAGE_TRAINING_DEFAULTS, OutputArguments, train_image_classifier

KEEP = 0.6
#: run name -> the flags that make it, after the seed's common ones. "full" writes the record the pruned runs read.
RUNS = {
    "full": [],
    "full-record-off": ["--sb_record", "false"],
    "variability": ["--sb_subset_keep", str(KEEP), "--sb_subset_by", "variability"],
    "random": ["--sb_subset_keep", str(KEEP), "--sb_subset_by", "random"],
    "overhead-on": [],
    "overhead-off": ["--sb_record", "false"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a folder holding cifar10 in the Hub's layout")
    parser.add_argument("--output_dir", required=True, help="results.json, report.md and the data map go here")
    parser.add_argument("--work_dir", default="/tmp/gpu-record", help="the runs' own output folders")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image_size", type=int, default=128)
    parser.add_argument("--pretrain_epochs", type=float, default=8)
    parser.add_argument("--pretrain_samples", type=int, default=None,
                        help="pretrain on the first N training images of classes 0-4 (default: all of them)")
    parser.add_argument("--epochs", type=float, default=6)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--budget_seconds", type=float, default=480,
                        help="skip a run that would end after this many seconds from the start")
    parser.add_argument("--overhead_pairs", type=int, default=0,
                        help="after the seeds: this many more pairs of Traditional runs with the record off and on "
                             "(the same seed, the order alternating), for the record's overhead per step")
    parser.add_argument("--overhead_epochs", type=float, default=2)
    parser.add_argument("--extra", default="", help="more scripts/train.py flags for every run")
    parser.add_argument("--merge", nargs="+", metavar="RESULTS_JSON",
                        help="train nothing: render OUT/report.md from these results.json files (several calls)")
    options = parser.parse_args()
    if options.merge:
        merged = merge([json.loads(Path(path).read_text()) for path in options.merge])
        Path(options.output_dir, "results.json").write_text(json.dumps(merged, indent=1))
        Path(options.output_dir, "report.md").write_text(render(merged))
        print(render(merged))
        return 0
    out, work = Path(options.output_dir), Path(options.work_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = {"settings": {**vars(options), "device": device, "keep": KEEP}, "provenance": provenance(), "runs": []}
    if device == "cuda":
        results["settings"]["gpu"] = torch.cuda.get_device_name()
    workflow.load_image_data = DeviceData(device)  # decoded once per class set, held on the device
    start = time.perf_counter()
    common = ["--dataset", f"{options.data}/cifar10", "--image_size", str(options.image_size), "--cutout", "0",
              "--learning_rate", str(options.learning_rate), "--eval_strategy", "no", "--save_strategy", "no",
              "--disable_tqdm", "true", "--logging_steps", "50", "--sb_strategy", "none",
              "--dataloader_pin_memory", "false", "--bf16", str(device == "cuda").lower(), *options.extra.split()]
    pretrained = work / "pretrained"
    pretrain = ["--model", options.model, "--classes", "0,1,2,3,4", "--eval_split", "none", "--seed", "0",
                "--num_train_epochs", str(options.pretrain_epochs), "--sb_record", "false"]
    if options.pretrain_samples:
        pretrain += ["--max_train_samples", str(options.pretrain_samples)]
    record_run(results, out, "pretrain", 0, train(common + pretrain, pretrained), start)
    for position, seed in enumerate(options.seeds):
        # The record's pair runs off first in the first seed and last in the others: the order alternates, and
        # where the budget runs short it is the run with the record off that is skipped, not a pruned run.
        pruned = ["variability", "random"]
        order = ["full-record-off", "full", *pruned] if position == 0 else ["full", *pruned, "full-record-off"]
        for name in order:
            elapsed = time.perf_counter() - start
            if elapsed + estimate(results, name) > options.budget_seconds:
                print(f"skipped seed {seed} {name}: {elapsed:.0f} s spent of {options.budget_seconds:.0f}", flush=True)
                continue
            folder = work / f"seed{seed}" / name
            flags = common + ["--classes", "5,6,7,8,9", "--model_name_or_path", str(pretrained), "--seed", str(seed),
                              "--num_train_epochs", str(options.epochs), *RUNS[name]]
            if name in ("variability", "random"):
                flags += ["--sb_subset_from", str(work / f"seed{seed}" / "full")]
            record_run(results, out, name, seed, train(flags, folder), start)
            if name == "full" and not (out / "data_map.png").exists() and (folder / "data_map.png").exists():
                shutil.copy(folder / "data_map.png", out / "data_map.png")
    for pair in range(options.overhead_pairs):
        for name in ("overhead-off", "overhead-on") if pair % 2 == 0 else ("overhead-on", "overhead-off"):
            elapsed = time.perf_counter() - start
            if elapsed + estimate(results, name, options.overhead_epochs / options.epochs) > options.budget_seconds:
                print(f"skipped pair {pair} {name}: {elapsed:.0f} s spent of {options.budget_seconds:.0f}", flush=True)
                continue
            flags = common + ["--classes", "5,6,7,8,9", "--model_name_or_path", str(pretrained), "--seed", "0",
                              "--num_train_epochs", str(options.overhead_epochs), *RUNS[name]]
            record_run(results, out, name, 0, train(flags, work / f"pair{pair}" / name), start, pair=pair)
    report = render(results)
    (out / "report.md").write_text(report)
    print(report)
    return 0


class DeviceData:
    """`load_image_data` with the decoded images kept on ``device`` and reused by every run on the same classes;
    each run gets its own augmentation generator, seeded as `load_image_data` seeds it."""

    def __init__(self, device: str):
        self.device = device
        self.loaded = {}

    def __call__(self, args: DataArguments, seed: int = 0, index_column: str = "index"):
        key = (args.classes, args.max_train_samples, args.eval_split, index_column)
        if key not in self.loaded:
            data = load_image_data(args, seed=seed, index_column=index_column)
            self.loaded[key] = dataclasses.replace(
                data, train=data.train.to(self.device), eval=data.eval.to(self.device) if data.eval else None
            )
        data = self.loaded[key]
        train = data.train.to(self.device)  # a new dataset over the same tensors, with a generator of its own
        given = train.transform
        train.transform = BatchTransform(data.mean, data.std, augment=given.augment, crop_padding=given.crop_padding,
                                         hflip=given.hflip, cutout=given.cutout, seed=seed)
        return dataclasses.replace(data, train=train)


def train(flags: list[str], folder: Path) -> dict:
    parser = HfArgumentParser((ModelArguments, DataArguments, OutputArguments, SelectiveBackpropConfig))
    parser.set_defaults(**IMAGE_TRAINING_DEFAULTS)
    model_args, data_args, _, config = parser.parse_args_into_dataclasses(
        args=flags + ["--output_dir", str(folder)]
    )
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    result = train_image_classifier(config, data_args, model_args, overwrite_output_dir=True)
    state = json.loads((folder / "trainer_state.json").read_text())
    return {"accuracy": result.accuracy, "train_seconds": result.stats["train_seconds"],
            "steps": state["global_step"], "examples": result.stats["backwards"]}


def record_run(results: dict, out: Path, name: str, seed: int, run: dict, start: float,
               pair: int | None = None) -> None:
    elapsed = time.perf_counter() - start
    before = results["runs"][-1]["elapsed_seconds"] if results["runs"] else 0.0
    run = {"name": name, "seed": seed, **run, "elapsed_seconds": round(elapsed, 1),
           "wall_seconds": round(elapsed - before, 1), "seconds_per_step": run["train_seconds"] / max(run["steps"], 1),
           "pair": pair}
    results["runs"].append(run)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    accuracy = "n/a" if run["accuracy"] is None else f"{run['accuracy']:.4f}"
    print(f"[{elapsed:.0f} s] seed {seed} {name}: accuracy {accuracy}, {run['steps']} steps, "
          f"{run['train_seconds']:.1f} s training ({1000 * run['seconds_per_step']:.1f} ms/step)", flush=True)


def estimate(results: dict, name: str, epochs_share: float = 1.0) -> float:
    """Seconds the next run called ``name`` should take, start to end: the training time of the last such run (else
    of the last run, scaled by the kept share and ``epochs_share``), with a margin, plus the most any run spent
    outside its training."""
    runs = [run for run in results["runs"] if run["name"] != "pretrain"]
    if not runs:
        return 0.0
    same = [run for run in runs if run["name"] == name]
    if same:
        training = same[-1]["train_seconds"]
    else:
        training = runs[-1]["train_seconds"] * (KEEP if name in ("variability", "random") else 1.0) * epochs_share
    return 1.2 * training + max(run["wall_seconds"] - run["train_seconds"] for run in runs)


def render(results: dict) -> str:
    runs = [run for run in results["runs"] if run["name"] != "pretrain"]
    settings = results["settings"]
    lines = [f"# The record on a GPU: {settings['model']} at {settings['image_size']} px, CIFAR-10 classes 5-9",
             "", f"Device: {settings.get('gpu', settings['device'])}. Command: `python benchmarks/gpu_record.py "
             f"--seeds {' '.join(map(str, settings['seeds']))} --budget_seconds {settings['budget_seconds']:g}`; "
             f"pretraining {settings['pretrain_epochs']:g} epochs, fine-tuning {settings['epochs']:g} epochs.", "",
             "| run | seeds | accuracy (%) | training time (s) | ms per step | examples trained |",
             "|---|---|---|---|---|---|"]
    for name in RUNS:
        chosen = [run for run in runs if run["name"] == name]
        if not chosen:
            continue
        accuracies = [100 * run["accuracy"] for run in chosen]
        lines.append(f"| {name} | {len(chosen)} | {spread(accuracies, 2)} | "
                     f"{spread([run['train_seconds'] for run in chosen], 1)} | "
                     f"{spread([1000 * run['seconds_per_step'] for run in chosen], 2)} | {chosen[0]['examples']:,} |")
    lines += ["", "| seed | record overhead per step (on / off - 1) | variability: time saving (cost model 1.67x) | "
              "random: time saving | variability minus random (points) | variability minus full (points) |",
              "|---|---|---|---|---|---|"]
    for seed in settings["seeds"]:
        by_name = {run["name"]: run for run in runs if run["seed"] == seed}
        full, off = by_name.get("full"), by_name.get("full-record-off")
        variability, random = by_name.get("variability"), by_name.get("random")
        overhead = (f"{100 * (full['seconds_per_step'] / off['seconds_per_step'] - 1):+.2f} %"
                    if full and off else "-")
        saving = [f"{full['train_seconds'] / run['train_seconds']:.2f}x" if full and run else "-"
                  for run in (variability, random)]
        gaps = [f"{100 * (a['accuracy'] - b['accuracy']):+.2f}" if a and b else "-"
                for a, b in ((variability, random), (variability, full))]
        lines.append(f"| {seed} | {overhead} | {saving[0]} | {saving[1]} | {gaps[0]} | {gaps[1]} |")
    pairs = sorted({run["pair"] for run in runs if run.get("pair") is not None})
    if pairs:
        lines += ["", f"The record's overhead per step in {len(pairs)} more pairs of Traditional runs "
                  f"({settings['overhead_epochs']:g} epochs each, one seed; off first in even pairs):", "",
                  "| pair | ms per step, record off | ms per step, record on | on / off - 1 |", "|---|---|---|---|"]
        for pair in pairs:
            by_name = {run["name"]: run for run in runs if run.get("pair") == pair}
            off, on = by_name.get("overhead-off"), by_name.get("overhead-on")
            if off and on:
                lines.append(f"| {pair} | {1000 * off['seconds_per_step']:.2f} | {1000 * on['seconds_per_step']:.2f} | "
                             f"{100 * (on['seconds_per_step'] / off['seconds_per_step'] - 1):+.2f} % |")
    return "\n".join(lines) + "\n"


def merge(calls: list[dict]) -> dict:
    """One table from several calls (a lent GPU's time runs out between seeds): their runs, seeds and commands."""
    settings = dict(calls[0]["settings"])
    settings["seeds"] = sorted({seed for call in calls for seed in call["settings"]["seeds"]
                                if any(run["seed"] == seed and run["name"] == "full" for run in call["runs"])})
    settings["overhead_epochs"] = next((call["settings"].get("overhead_epochs") for call in calls
                                        if call["settings"].get("overhead_pairs")), 2)
    pair_offset, runs = 0, []
    for call in calls:
        for run in call["runs"]:
            if run.get("pair") is not None:
                run = {**run, "pair": run["pair"] + pair_offset}
            runs.append(run)
        pair_offset += call["settings"].get("overhead_pairs", 0)
    return {"settings": settings, "calls": [{"settings": c["settings"], "provenance": c["provenance"]} for c in calls],
            "runs": runs}


def spread(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
