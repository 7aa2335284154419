"""Mean and spread over seeds of the benchmark logs in <root>/seed*/ (written by benchmarks/benchmark.py).

    python benchmarks/benchmark_seeds.py --root benchmarks/results/cifar10-lossless --title "CIFAR-10 ..."
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from harness.seeds import write_seeds_report


@dataclass
class SeedsArguments:
    root: str = field(metadata={"help": "Folder holding seed*/ subfolders of per-strategy JSON logs."})
    title: str = field(default="Benchmark over seeds", metadata={"help": "Report title."})
    clock: str = field(default="wall", metadata={"help": "wall or cpu.", "choices": ["wall", "cpu"]})


def main() -> None:
    (args,) = HfArgumentParser(SeedsArguments).parse_args_into_dataclasses()
    print(write_seeds_report(args.root, args.title, args.clock))


if __name__ == "__main__":
    main()
