"""`make gpu-check`: what the trainer does on a CUDA device, in one markdown report plus JSON (docs/gpu.md).

    python scripts/gpu_check.py [--output_dir benchmarks/results/gpu-check] [--data CIFAR10_FOLDER]
                                [--sections pytest,precision,syncs,throughput] [--budget_seconds 470]

Sections, each in its own process (a crash or hang costs only its own section) and in this order:

- ``pytest``: ``pytest -m gpu`` (tests/test_gpu.py: transfers, one wait per selection batch, selection
  precision, bit-exact resume on CUDA, the 2-process lockstep test under NCCL with two devices);
- ``precision``: bf16 and fp16 training with sb, Stale-SB and infobatch on a CIFAR-10 subset: finite
  losses, counters, the fp16 loss scaler's skipped steps;
- ``syncs``: host synchronisations per selection batch and per optimizer step
  (``torch.cuda.set_sync_debug_mode``), with the line of code that made each;
- ``throughput``: all 50,000 CIFAR-10 training images, one cycle each of Traditional, SB, Stale-SB
  (n=3: three epochs), InfoBatch (two epochs: the first has no losses to prune by) and the uniform
  control: examples/s, the time split, measured phi and r, and the cost model's ideal beside each.

Without a CUDA device it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SECTIONS = ("pytest", "precision", "syncs", "throughput")
KEEP = 1 / 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", default=str(ROOT / "benchmarks" / "results" / "gpu-check"))
    parser.add_argument("--data", default=default_data(), help="CIFAR-10 in the Hub's layout (a folder or Hub id)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--budget_seconds", type=float, default=470.0, help="all sections together")
    parser.add_argument("--run", choices=SECTIONS, help=argparse.SUPPRESS)  # one section, in a child process
    options = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check.")
        return 0
    out = Path(options.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if options.run:
        result = globals()[f"section_{options.run}"](options, out)
        (out / f"{options.run}.json").write_text(json.dumps(result, indent=1, default=str))
        return 0
    return orchestrate(options, out)


def default_data() -> str:
    """A local copy of CIFAR-10 beside or inside the checkout, else the Hub's (which needs the network)."""
    for folder in (ROOT / "shared" / "data" / "cifar10", ROOT.parent / "shared" / "data" / "cifar10"):
        if folder.is_dir():
            return str(folder)
    return "uoft-cs/cifar10"


# ---- orchestration ---------------------------------------------------------------------------------


def orchestrate(options, out: Path) -> int:
    deadline = time.monotonic() + options.budget_seconds
    report = {"environment": environment(), "sections": {}}
    for name in [s.strip() for s in options.sections.split(",") if s.strip()]:
        left = deadline - time.monotonic()
        if left < 20:
            report["sections"][name] = {"status": "not run: the time budget was spent"}
            continue
        (out / f"{name}.json").unlink(missing_ok=True)
        command = [sys.executable, __file__, "--run", name, "--output_dir", str(out), "--data", options.data]
        start = time.monotonic()
        # The repository first, then whatever path the caller set (packages installed with --target, say).
        python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path}
        try:
            process = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
            tail = (process.stdout + process.stderr)[-4000:]
        except subprocess.TimeoutExpired as error:
            status, tail = f"timed out after {left:.0f} s", str(error.stdout or "")[-4000:]
        result = json.loads((out / f"{name}.json").read_text()) if (out / f"{name}.json").exists() else {}
        report["sections"][name] = {"status": status, "seconds": round(time.monotonic() - start, 1), **result}
        if status != "ok":
            report["sections"][name]["output_tail"] = tail
        print(f"gpu-check: {name}: {status} ({time.monotonic() - start:.0f} s)", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render(report))
    print(f"gpu-check: wrote {out / 'report.md'} and report.json")
    failed = [n for n, s in report["sections"].items() if s["status"] != "ok"]
    return 1 if failed else 0


def environment() -> dict:
    import accelerate
    import torch
    import transformers

    return {
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
    }


# ---- shared set-up ---------------------------------------------------------------------------------


def cifar_workload(data: str, max_train_samples: int | None, seed: int = 0):
    """CIFAR-10 decoded once (uint8, augmented per batch) and timm resnet18, as the CPU benchmarks use."""
    from hf_selective_backprop.benchmarks.workloads import image_workload
    from hf_selective_backprop.data import DataArguments
    from hf_selective_backprop.models import ModelArguments

    data_args = DataArguments(dataset=data, eval_split="test", max_train_samples=max_train_samples,
                              max_eval_samples=2000)
    return image_workload(data_args, ModelArguments(model="resnet18"), seed)


def train(workload, output_dir: str, hook=None, engine_class=None, **overrides):
    """Train on ``workload`` (batch 128, SGD as in the paper); ``hook(trainer)`` runs before training starts."""
    import torch

    from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer

    settings = dict(
        output_dir=output_dir, per_device_train_batch_size=128, learning_rate=0.1, optim="sgd",
        optim_args="momentum=0.9", weight_decay=5e-4, num_train_epochs=2, save_strategy="no", logging_steps=10,
        report_to="none", disable_tqdm=True, seed=0, use_cpu=not torch.cuda.is_available(),
    )
    settings.update(overrides)
    trainer_cls = SelectiveBackpropTrainer
    if engine_class is not None:
        trainer_cls = type("CheckTrainer", (SelectiveBackpropTrainer,), {"engine_class": engine_class})
    trainer = trainer_cls(model=workload.build_model(), args=SelectiveBackpropConfig(**settings),
                          train_dataset=workload.train)
    if hook is not None:
        hook(trainer)
    trainer.train()
    return trainer


# ---- sections --------------------------------------------------------------------------------------


def section_pytest(options, out: Path) -> dict:
    xml = out / "pytest.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-rA", "-p", "no:cacheprovider",
               f"--junitxml={xml}"]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if not xml.exists():  # pytest stopped before collecting (an import error in conftest, say)
        output = (process.stdout + process.stderr)[-3000:]
        raise RuntimeError(f"pytest wrote no report (exit {process.returncode}):\n{output}")
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = tag, (node.get("message") or "")[:300]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})
    return {"exit_code": process.returncode, "tests": tests, "summary": process.stdout.strip().splitlines()[-1:]}


def section_precision(options, out: Path) -> dict:
    import math

    from transformers import TrainerCallback

    class SkippedSteps(TrainerCallback):
        def __init__(self, trainer):
            self.trainer, self.skipped = trainer, 0

        def on_step_end(self, args, state, control, **kwargs):
            self.skipped += int(self.trainer.accelerator.optimizer_step_was_skipped)

    workload = cifar_workload(options.data, 4096)
    runs = []
    strategies = {
        "sb": {"sb_strategy": "sb"},
        "stale-sb": {"sb_strategy": "sb", "sb_staleness": 3, "num_train_epochs": 3},
        "infobatch": {"sb_strategy": "infobatch"},
    }
    for precision in ("bf16", "fp16"):
        for name, overrides in strategies.items():
            counters = []
            trainer = train(workload, str(out / "runs" / f"{precision}-{name}"),
                            hook=lambda t, found=counters: (found.append(SkippedSteps(t)), t.add_callback(found[-1])),
                            logging_steps=1, **{precision: True, **overrides})
            losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
            scaler = trainer.accelerator.scaler
            stats = trainer.sb_stats
            runs.append({
                "precision": precision, "strategy": name, "logged_losses": len(losses),
                "losses_finite": bool(losses) and all(math.isfinite(x) for x in losses),
                "last_loss": losses[-1] if losses else None, "skipped_steps": counters[0].skipped,
                "loss_scale": scaler.get_scale() if scaler is not None else None,
                **{k: stats[k] for k in ("examples_seen", "selection_forwards", "kept", "backwards",
                                         "optimizer_steps", "nonfinite_losses")},
            })
    return {"train_examples": len(workload.train), "runs": runs}


def section_syncs(options, out: Path) -> dict:
    import torch

    from hf_selective_backprop.engine import SelectionEngine

    class CountingEngine(SelectionEngine):
        def add_batch(self, batch, selecting, model):
            Phase.batches += 1
            return super().add_batch(batch, selecting, model)

    class Phase:
        current, batches, sites = "step", 0, []

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            Phase.sites.append((Phase.current, f"{os.path.relpath(filename, ROOT)}:{lineno}"))

    def in_batch_phase(trainer):
        original = trainer.get_batch_samples

        def get_batch_samples(*args, **kwargs):
            Phase.current = "batch"
            try:
                return original(*args, **kwargs)
            finally:
                Phase.current = "step"

        trainer.get_batch_samples = get_batch_samples

    workload = cifar_workload(options.data, 2048)
    runs = {}
    for name, overrides in {
        "traditional": {"sb_strategy": "none"},
        "sb": {"sb_strategy": "sb"},
        "sb, non-blocking loader": {"sb_strategy": "sb", "accelerator_config": {"non_blocking": True}},
        "stale-sb": {"sb_strategy": "sb", "sb_staleness": 2},
        "infobatch": {"sb_strategy": "infobatch"},
    }.items():
        Phase.batches, Phase.sites = 0, []
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer = train(workload, str(out / "runs" / name), in_batch_phase, CountingEngine, **overrides)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        steps = trainer.state.global_step
        batches = Phase.batches or steps  # Traditional: one loaded batch per step
        sites: dict[str, dict[str, int]] = {"batch": {}, "step": {}}
        for phase, site in Phase.sites:
            sites[phase][site] = sites[phase].get(site, 0) + 1
        in_batches = sum(sites["batch"].values())
        runs[name] = {
            "selection_batches": batches, "optimizer_steps": steps,
            "per_selection_batch": in_batches / max(batches, 1),
            "per_optimizer_step_outside_batches": sum(sites["step"].values()) / max(steps, 1),
            "sites": {phase: dict(sorted(found.items(), key=lambda kv: -kv[1])) for phase, found in sites.items()},
        }
    return {"train_examples": len(workload.train), "epochs": 2, "runs": runs}


def section_throughput(options, out: Path) -> dict:
    import torch

    from hf_selective_backprop.benchmarks.runner import RunSettings, run_strategy, write_log
    from hf_selective_backprop.benchmarks.strategies import Strategy, build_strategy

    workload = cifar_workload(options.data, None)
    costs = measure_costs(workload)
    settings = RunSettings(output_dir=str(out / "throughput"), num_train_epochs=1)
    plan = [("traditional", 1), ("sb", 1), ("stale-sb", 3), ("infobatch", 2), ("uniform", 1)]
    logs = {}
    for name, epochs in plan:
        base = build_strategy(name, KEEP, 3, 0)
        overrides = dict(base.overrides)
        if overrides.get("sb_strategy") != "none":
            overrides["sb_sync_timers"] = True  # the time split measures the work, not kernel launches
        strategy = Strategy(base.name, base.label, overrides)
        log = run_strategy(strategy, workload, settings, epochs)
        write_log(log, str(out / "throughput" / f"{name}.json"))
        logs[name] = log
        torch.cuda.empty_cache()
    rows = throughput_rows(logs, costs)
    return {"train_examples": len(workload.train), "costs": costs, "rows": rows}


def measure_costs(workload, repeats: int = 20) -> dict:
    """F (training forward), (1+r)F (forward, backward, SGD step) and the selection forward, per batch of 128."""
    import torch

    from hf_selective_backprop.engine.scoring import SelectionScorer
    from hf_selective_backprop.losses import cross_entropy_per_example

    model = workload.build_model().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rows = workload.train.__getitems__(list(range(128)))
    batch = {k: torch.stack([r[k] for r in rows]).cuda() for k in ("pixel_values", "labels")}

    def timed(fn) -> float:
        times = []
        for i in range(repeats + 3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if i >= 3:  # warm-up: cuDNN autotuning, allocator
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    def forward():
        model.train()
        return model(**batch).loss

    def step():
        optimizer.zero_grad(set_to_none=True)
        forward().backward()
        optimizer.step()

    scorers = {p: SelectionScorer(cross_entropy_per_example, precision=p) for p in ("fp32", "bf16")}
    f, full = timed(forward), timed(step)
    selection = {p: timed(lambda s=s: s(model, batch)) for p, s in scorers.items()}
    return {"batch": 128, "forward_ms": 1e3 * f, "step_ms": 1e3 * full, "r": full / f - 1,
            "phi": {p: t / f for p, t in selection.items()}}


def throughput_rows(logs: dict, costs: dict) -> list[dict]:
    base = logs["traditional"]
    base_rate = base["stats"]["examples_seen"] / base["train_wall_seconds"]
    r, phi = costs["r"], costs["phi"]["fp32"]
    rows = []
    for name, log in logs.items():
        stats = log["stats"]
        seen = stats["examples_seen"]
        rate = seen / log["train_wall_seconds"]
        s = stats["backwards"] / seen
        phi_eff = phi * stats.get("selection_forwards", 0) / seen
        measured_phi = None
        if stats.get("selection_forwards"):
            per_example_forward = costs["forward_ms"] / 1e3 / costs["batch"]
            measured_phi = stats["selection_forward_seconds"] / stats["selection_forwards"] / per_example_forward
        ideal = (1 + r) / (phi_eff + s * (1 + r))
        rows.append({
            "strategy": name, "epochs": log["epochs_trained"], "examples_per_second": rate,
            "speedup": rate / base_rate, "ideal": ideal, "measured_over_ideal": rate / base_rate / ideal,
            "s": s, "phi_in_run": measured_phi, "test_error": log["evals"][-1]["error"],
            "data_seconds": stats.get("data_seconds", 0.0),
            "selection_forward_seconds": stats.get("selection_forward_seconds", 0.0),
            "bookkeeping_seconds": stats.get("selection_overhead_seconds", 0.0),
            "training_seconds": log["train_wall_seconds"] - stats.get("data_seconds", 0.0)
            - stats.get("selection_forward_seconds", 0.0) - stats.get("selection_overhead_seconds", 0.0),
            "train_wall_seconds": log["train_wall_seconds"],
        })
    return rows


# ---- the report ------------------------------------------------------------------------------------


def render(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# gpu-check", "",
        f"Devices: {', '.join(env['devices'])}; torch {env['torch']} (CUDA {env['cuda']}, cuDNN {env['cudnn']}), "
        f"transformers {env['transformers']}, accelerate {env['accelerate']}; commit {env['commit'][:12]}.", "",
        "| section | status | seconds |", "|---|---|---|",
    ]
    lines += [f"| {n} | {s['status']} | {s.get('seconds', '-')} |" for n, s in report["sections"].items()]
    sections = report["sections"]
    if sections.get("pytest", {}).get("tests"):
        lines += ["", "## pytest -m gpu", "", "| test | outcome | s | message |", "|---|---|---|---|"]
        lines += [f"| {t['test']} | {t['outcome']} | {t['seconds']:.1f} | {t['message']} |"
                  for t in sections["pytest"]["tests"]]
    if sections.get("precision", {}).get("runs"):
        lines += ["", f"## Mixed precision ({sections['precision']['train_examples']} CIFAR-10 images, resnet18)", "",
                  "| precision | strategy | losses logged | all finite | last loss | fp16 skipped steps | loss scale | "
                  "seen | selection fwd | kept | backwards | steps | non-finite |", "|" + "---|" * 13]
        columns = ("precision", "strategy", "logged_losses", "losses_finite", "last_loss", "skipped_steps",
                   "loss_scale", "examples_seen", "selection_forwards", "kept", "backwards", "optimizer_steps",
                   "nonfinite_losses")
        for run in sections["precision"]["runs"]:
            lines.append("| " + " | ".join(str(run[k]) for k in columns) + " |")
    if sections.get("syncs", {}).get("runs"):
        lines += ["", "## Host synchronisations (torch.cuda.set_sync_debug_mode)", "",
                  "| run | selection batches | steps | per selection batch | per step, outside batch assembly | "
                  "where (per selection batch) |", "|---|---|---|---|---|---|"]
        for name, run in sections["syncs"]["runs"].items():
            where = ", ".join(f"{site} x{count}" for site, count in list(run["sites"]["batch"].items())[:6])
            lines.append(f"| {name} | {run['selection_batches']} | {run['optimizer_steps']} | "
                         f"{run['per_selection_batch']:.2f} | {run['per_optimizer_step_outside_batches']:.2f} | "
                         f"{where} |")
    if sections.get("throughput", {}).get("rows"):
        costs = sections["throughput"]["costs"]
        lines += ["", f"## Throughput, all {sections['throughput']['train_examples']} CIFAR-10 training images", "",
                  f"Per batch of 128: training forward F {costs['forward_ms']:.1f} ms, step (1+r)F "
                  f"{costs['step_ms']:.1f} ms: r = {costs['r']:.2f}; selection forward phi = "
                  f"{costs['phi']['fp32']:.2f} (fp32), {costs['phi']['bf16']:.2f} (bf16 autocast).", "",
                  "| strategy | epochs | examples/s | vs Traditional | ideal | measured/ideal | s | phi in run | "
                  "data s | selection fwd s | bookkeeping s | training s | test error |", "|" + "---|" * 13]
        for row in sections["throughput"]["rows"]:
            phi = f"{row['phi_in_run']:.2f}" if row["phi_in_run"] is not None else "-"
            lines.append(
                f"| {row['strategy']} | {row['epochs']:g} | {row['examples_per_second']:.0f} | {row['speedup']:.2f} | "
                f"{row['ideal']:.2f} | {row['measured_over_ideal']:.2f} | {row['s']:.3f} | {phi} | "
                f"{row['data_seconds']:.1f} | {row['selection_forward_seconds']:.1f} | "
                f"{row['bookkeeping_seconds']:.1f} | {row['training_seconds']:.1f} | {row['test_error']:.3f} |")
    for name, section in sections.items():
        if "output_tail" in section:
            lines += ["", f"## {name}: output tail", "", "```", section["output_tail"], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
