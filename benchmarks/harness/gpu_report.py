"""`make gpu-check`'s report: the pytest results read from JUnit XML, the throughput table beside the cost model,
and the markdown that `benchmarks/gpu_check.py` writes to report.md (docs/gpu.md).

Reads and writes plain dicts (what each section's JSON holds); no torch. The sections themselves run in
`benchmarks/gpu_check.py` (pytest), `benchmarks/gpu_diagnostics.py` (precision, syncs) and
`benchmarks/gpu_throughput.py` (throughput).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from .cost_model import ideal_speedup, phi_from_times

SECTIONS = ("pytest", "precision", "syncs", "throughput")


def run_section(name: str, output_dir: str, section) -> dict | None:
    """Run one CUDA section of `make gpu-check`: ``section(out)`` returns its results, written to
    OUT/<name>.json. Without a CUDA device it says so in one line and returns None (the check exits 0)."""
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); nothing to check.")
        return None
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = section(out)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
    return result


def pytest_results(xml: Path, exit_code: int, stdout: str) -> dict:
    """The pytest section: each test case of the JUnit report with its outcome, seconds and message."""
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = tag, (node.get("message") or "")[:300]
        tests.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})
    return {"exit_code": exit_code, "tests": tests, "summary": stdout.strip().splitlines()[-1:]}


def throughput_rows(logs: dict, costs: dict) -> list[dict]:
    """One row per run log: examples/s and its ratio to Traditional's beside the cost model's ideal, with the
    run's kept fraction s, its scored share and phi as measured on one batch (``costs``), and the time split."""
    base = logs["traditional"]
    base_rate = base["stats"]["examples_seen"] / base["train_wall_seconds"]
    r, phi = costs["r"], costs["phi"]["fp32"]
    rows = []
    for name, log in logs.items():
        stats = log["stats"]
        seen = stats["examples_seen"]
        rate = seen / log["train_wall_seconds"]
        s = stats["backwards"] / seen
        ideal = ideal_speedup(r, phi, kept=s, scored=stats.get("selection_forwards", 0) / seen)
        measured_phi = None
        if stats.get("selection_forwards"):
            per_example_forward = costs["forward_ms"] / 1e3 / costs["batch"]
            measured_phi = phi_from_times(stats["selection_forward_seconds"], stats["selection_forwards"],
                                          per_example_forward)
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


def render_throughput(section: dict) -> list[str]:
    """The throughput section's markdown lines (empty without rows)."""
    if not section.get("rows"):
        return []
    costs = section["costs"]
    lines = [f"## Throughput, all {section['train_examples']} CIFAR-10 training images", "",
             f"Per batch of 128: training forward F {costs['forward_ms']:.1f} ms, step (1+r)F "
             f"{costs['step_ms']:.1f} ms: r = {costs['r']:.2f}; selection forward phi = "
             f"{costs['phi']['fp32']:.2f} (fp32), {costs['phi']['bf16']:.2f} (bf16 autocast).", "",
             "| strategy | epochs | examples/s | vs Traditional | ideal | measured/ideal | s | phi in run | "
             "data s | selection fwd s | bookkeeping s | training s | test error |", "|" + "---|" * 13]
    for row in section["rows"]:
        phi = f"{row['phi_in_run']:.2f}" if row["phi_in_run"] is not None else "-"
        lines.append(
            f"| {row['strategy']} | {row['epochs']:g} | {row['examples_per_second']:.0f} | {row['speedup']:.2f} | "
            f"{row['ideal']:.2f} | {row['measured_over_ideal']:.2f} | {row['s']:.3f} | {phi} | "
            f"{row['data_seconds']:.1f} | {row['selection_forward_seconds']:.1f} | "
            f"{row['bookkeeping_seconds']:.1f} | {row['training_seconds']:.1f} | {row['test_error']:.3f} |")
    return lines


def render(report: dict) -> str:
    """report.md from report.json: the environment, each section's status, then what each section found."""
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
    throughput = render_throughput(sections.get("throughput", {}))
    if throughput:
        lines += ["", *throughput]
    for name, section in sections.items():
        if "output_tail" in section:
            lines += ["", f"## {name}: output tail", "", "```", section["output_tail"], "```"]
    return "\n".join(lines) + "\n"
