"""The trainer flags of benchmark strategy names, for the workloads whose scripts take flags rather than names
(benchmarks/run_frontier.sh's SFT part runs scripts/train_sft.py with them).

    python benchmarks/strategy_flags.py stale-sb-n2-keep0.5
    --sb_strategy sb --sb_keep 0.5 --sb_staleness 2

A name is what benchmarks/benchmark.py --strategies takes (knobs included); `uniform-for-<name>` needs the backward
fraction <name> realised, which only its run knows: pass the control as `--sb_strategy uniform --sb_keep <fraction>`.
"""

import sys

from harness.strategies import build_strategy


def flags(name: str) -> list[str]:
    if name.startswith("uniform-for-"):
        raise ValueError(f"{name!r}: a control's kept fraction is the one its strategy realised; pass it yourself")
    strategy = build_strategy(name, keep=1 / 3, staleness=3, warmup_epochs=1)
    words = []
    for flag, value in strategy.overrides.items():
        words += [f"--{flag}", str(value).lower() if isinstance(value, bool) else str(value)]
    return words


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/strategy_flags.py <strategy name>")
    print(" ".join(flags(sys.argv[1])))
