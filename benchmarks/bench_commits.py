"""The trainer's throughput at two commits, side by side: did a change of the code slow a step?

    python benchmarks/bench_commits.py --before 83287ed --after HEAD --rounds 4

Checks both commits out into temporary git worktrees and runs part 2 of benchmarks/bench_selection_pass.py (the
Trainer's examples per second for 'none', 'sb', 'sb' with the fastest selection option and Stale-SB) from each,
alternating before, after, after, before, ... so that a drift of the machine's speed falls on both. Every run is a
process of its own with the checkout first on its path. Prints, per run, the median examples per second at each
commit, the after/before ratio of each round's pair, and their median and range. Timing is the point: run it on an
otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout(revision: str, folder: str) -> str:
    """``revision`` as a detached worktree in ``folder``; returns its full commit id."""
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", folder, revision], check=True,
                   capture_output=True)
    return subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def throughput(tree: str, bench_args: list[str], output_dir: str) -> dict[str, float]:
    """One bench_selection_pass.py run from ``tree``: examples per second by run name."""
    env = {**os.environ, "PYTHONPATH": tree, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    command = [sys.executable, os.path.join(tree, "benchmarks", "bench_selection_pass.py"), "--train_rounds", "1",
               "--output_dir", output_dir, *bench_args]
    subprocess.run(command, check=True, cwd=tree, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(output_dir, "results.json")) as handle:
        runs = json.load(handle)["throughput"]
    return {name: run["examples_per_second"] for name, run in runs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit measured as the baseline")
    parser.add_argument("--after", default="HEAD", help="the commit measured against it")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs (before and after), order alternating")
    parser.add_argument("--output", default=None, help="also write the report (markdown) here")
    args, bench_args = parser.parse_known_args(argv)
    bench_args = bench_args or ["--repeats", "3"]
    scratch = tempfile.mkdtemp(prefix="bench-commits-")
    try:
        trees = {name: os.path.join(scratch, name) for name in ("before", "after")}
        commits = {name: checkout(getattr(args, name), tree) for name, tree in trees.items()}
        measured = {"before": [], "after": []}
        for round_index in range(args.rounds):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for name in order:
                result = throughput(trees[name], bench_args, os.path.join(scratch, f"{name}-{round_index}"))
                measured[name].append(result)
                print(f"round {round_index + 1}, {name}: " + ", ".join(f"{run} {rate:.1f}/s"
                                                                       for run, rate in result.items()), flush=True)
        print(report(args, commits, measured, bench_args))
        if args.output:
            with open(args.output, "w") as handle:
                handle.write(report(args, commits, measured, bench_args) + "\n")
    finally:
        for tree in (os.path.join(scratch, "before"), os.path.join(scratch, "after")):
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def report(args, commits: dict, measured: dict, bench_args: list[str]) -> str:
    lines = [
        f"`python benchmarks/bench_commits.py --before {args.before} --after {args.after} --rounds {args.rounds} "
        f"{' '.join(bench_args)}`: before {commits['before'][:10]}, after {commits['after'][:10]}, "
        f"{os.cpu_count()} CPUs. Examples per second of benchmarks/bench_selection_pass.py's part 2, one run per "
        "commit per round, the order alternating.",
        "",
        "| run | before: median examples/s | after: median examples/s | after / before per round: median (range) |",
        "|---|---|---|---|",
    ]
    for run in measured["before"][0]:
        before = [result[run] for result in measured["before"]]
        after = [result[run] for result in measured["after"]]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        lines.append(f"| {run} | {statistics.median(before):.1f} | {statistics.median(after):.1f} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
