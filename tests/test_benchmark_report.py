"""The benchmark report's maths on hand-made logs (no training)."""

import json

import pytest

from harness.logs import breakdown, load_logs
from harness.report import (
    epochs_for_budget,
    epochs_for_relative_budget,
    relative_epoch_costs,
    render_table1,
    table1,
    time_to_error,
    write_report,
)


def make_log(name, errors, wall, cpu=None, cycle=1, **stats):
    cpu = cpu or [t / 2 for t in wall]
    return {
        "strategy": name,
        "label": name.title(),
        "cycle": cycle,
        "epochs_trained": float(len(errors)),
        "evals": [
            {"epoch": float(i + 1), "error": e, "accuracy": 1 - e, "train_wall_seconds": w, "train_cpu_seconds": c}
            for i, (e, w, c) in enumerate(zip(errors, wall, cpu, strict=True))
        ],
        "train_wall_seconds": wall[-1],
        "train_cpu_seconds": cpu[-1],
        "stats": {"examples_seen": 100 * len(errors), "backwards": 100, "selection_forwards": 0, **stats},
        "timings": {"train_step_seconds": 0.0, "optimizer_seconds": 0.0},
    }


@pytest.fixture
def logs():
    return {
        # final error 0.10: targets 0.10 / 0.11 / 0.12 / 0.14 first reached at 40 / 40 / 30 / 20 s
        "traditional": make_log("traditional", [0.5, 0.13, 0.115, 0.10], [10, 20, 30, 40]),
        # 0.12 exactly equals 1.2 x 0.10 (0.12000000000000001 in floating point): reached
        "sb": make_log("sb", [0.3, 0.13, 0.12, 0.105], [5, 10, 15, 20], selection_forwards=400),
        "uniform": make_log("uniform", [0.6, 0.5], [3, 6]),
    }


def test_time_to_error_reads_the_first_evaluation_at_or_below_target(logs):
    assert time_to_error(logs["traditional"], 0.14) == 20
    assert time_to_error(logs["traditional"], 0.12) == 30
    assert time_to_error(logs["sb"], 1.2 * 0.10) == 15
    assert time_to_error(logs["sb"], 0.10) is None
    assert time_to_error(logs["sb"], 0.14, clock="cpu") == 5


def test_table1_speedups_and_not_reached(logs):
    table = table1(logs)
    assert table["baseline_error"] == pytest.approx(0.10)
    rows = {row["strategy"]: row for row in table["rows"]}
    trad, sb, uniform = rows["traditional"], rows["sb"], rows["uniform"]
    assert trad["times"] == {1.0: 40, 1.1: 40, 1.2: 30, 1.4: 20}
    assert all(s == pytest.approx(1.0) for s in trad["speedups"].values())
    assert sb["times"] == {1.0: None, 1.1: 20, 1.2: 15, 1.4: 10}
    assert sb["speedups"][1.0] is None
    assert sb["speedups"][1.1] == pytest.approx(2.0)
    assert sb["speedups"][1.2] == pytest.approx(2.0)
    assert sb["speedups"][1.4] == pytest.approx(2.0)
    assert sb["final_error"] == pytest.approx(0.105) and sb["best_error"] == pytest.approx(0.105)
    assert sb["selection_forwards"] == 400
    assert all(t is None for t in uniform["times"].values())
    assert all(s is None for s in uniform["speedups"].values())
    text = render_table1(table)
    assert "not reached" in text and "2.00x" in text


def test_table1_needs_traditional(logs):
    del logs["traditional"]
    with pytest.raises(ValueError, match="traditional"):
        table1(logs)


def test_epochs_for_budget_interpolates_and_extrapolates():
    log = make_log("stale-sb", [0.5, 0.4, 0.3], [10, 14, 18], cycle=1)
    assert epochs_for_budget(log, 5) == pytest.approx(0.5)
    assert epochs_for_budget(log, 12) == pytest.approx(1.5)
    assert epochs_for_budget(log, 26) == pytest.approx(5.0)  # 4 s per epoch past the log
    # Stale-SB n=3: costs repeat every 3 epochs (10 + 4 + 4 s), so extrapolate at 18 s / 3 epochs.
    stale = make_log("stale-sb", [0.5] * 6, [10, 14, 18, 28, 32, 36], cycle=3)
    assert epochs_for_budget(stale, 54) == pytest.approx(9.0)
    assert epochs_for_budget(stale, 27, clock="cpu") == pytest.approx(9.0)  # CPU clock: half the wall


def test_relative_budget_cancels_a_load_that_drifts_between_rounds():
    # The machine gets twice as fast after round 2; each round costs SB 0.5 of Traditional.
    trad = make_log("traditional", [0.5] * 4, [20, 40, 50, 60])
    sb = make_log("sb", [0.5] * 4, [10, 20, 25, 30])
    assert relative_epoch_costs(sb, trad) == pytest.approx([0.5] * 4)
    assert epochs_for_relative_budget(trad, trad, 4.0) == pytest.approx(4.0)
    assert epochs_for_relative_budget(sb, trad, 1.25) == pytest.approx(2.5)
    assert epochs_for_relative_budget(sb, trad, 4.0) == pytest.approx(8.0)  # 2 + (4 - 2) / 0.5 past the log
    # Seconds would instead extrapolate at the late, fast cost: 4 + (60 - 30) / 5 = 10 epochs.
    assert epochs_for_budget(sb, 60) == pytest.approx(10.0)


def test_breakdown_other_is_the_rest():
    log = make_log(
        "sb", [0.5], [100.0], data_seconds=5.0, selection_forward_seconds=20.0, selection_overhead_seconds=1.0
    )
    log["timings"] = {"train_step_seconds": 60.0, "optimizer_seconds": 4.0}
    b = breakdown(log)
    assert b["training"] == 64.0 and b["other"] == pytest.approx(10.0) and b["total"] == 100.0


def test_breakdown_table_shows_the_time_per_optimizer_step():
    from harness.report import render_breakdown

    log = make_log("sb", [0.5], [100.0], optimizer_steps=8)
    log["timings"] = {"train_step_seconds": 60.0, "optimizer_seconds": 0.2}
    row = render_breakdown({"sb": log}).splitlines()[-1]
    assert row.endswith("| 25.0 ms |")


def test_report_is_rebuilt_from_the_json_logs_alone(logs, tmp_path):
    for name, log in logs.items():
        log["machine"] = {"loadavg_before": [1, 1, 1], "loadavg_after": [2, 2, 2]}
        (tmp_path / f"{name}.json").write_text(json.dumps(log))
    (tmp_path / "notes.json").write_text(json.dumps({"not": "a log"}))
    assert list(load_logs(str(tmp_path))) == ["traditional", "sb", "uniform"]
    path = write_report(str(tmp_path), "hand-made", plots=False)
    text = open(path).read()
    assert "Traditional's final test error: 10.00 %" in text
    assert "not reached" in text


def test_turnstile_runs_one_epoch_of_each_in_turn():
    import threading

    from harness.runner import Turnstile

    turnstile = Turnstile(["a", "b", "c"])
    trace = []

    def run(name, epochs):
        turnstile.wait(name)
        for epoch in range(epochs):
            trace.append((name, epoch))
            if epoch < epochs - 1:
                turnstile.pass_on(name)
                turnstile.wait(name)
        turnstile.leave(name)

    threads = [threading.Thread(target=run, args=job) for job in (("a", 2), ("b", 1), ("c", 3))]
    for thread in reversed(threads):
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert trace == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("c", 2)]


def test_benchmark_modules_import_no_circle():
    import ast
    from pathlib import Path

    import harness as package

    folder = Path(package.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        # Function-level imports count too: a lazy import still closes a circle.
        nodes = ast.walk(ast.parse(path.read_text()))
        graph[path.stem] = {
            node.module.split(".")[0] for node in nodes if isinstance(node, ast.ImportFrom) and node.level == 1
        }

    def reaches(start, target, seen=()):
        return any(n == target or (n not in seen and reaches(n, target, (*seen, n))) for n in graph.get(start, ()))

    assert "plots" in graph and "report" in graph["cli"]
    assert [name for name in graph if reaches(name, name)] == []


def test_report_without_matplotlib_and_plots_name_the_extra(logs, tmp_path, monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "harness.plots", raising=False)
    for name, log in logs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(log))
    assert write_report(str(tmp_path), "no plots", plots=False).endswith("report.md")
    with pytest.raises(ImportError, match=r"hf-selective-backprop\[benchmarks\]"):
        importlib.import_module("harness.plots")


def test_provenance_counts_code_changes_but_not_the_benchmarks_own_results(tmp_path, monkeypatch):
    import subprocess

    from harness.provenance import provenance

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "benchmarks" / "results" / "run").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "run" / "report.md").write_text("old\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.chdir(tmp_path)
    assert provenance()["clean_tree"] is True
    (tmp_path / "benchmarks" / "results" / "run" / "report.md").write_text("rewritten by the previous run\n")
    assert provenance()["clean_tree"] is True
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance()["clean_tree"] is False
