"""Report of the lossless frontier: each strategy's largest saving at Traditional's accuracy, beside the random
subset's, with the figure of accuracy against measured saving.

    python benchmarks/frontier_report.py --root benchmarks/results/frontier-cifar10-cifar_convnet_half/epochs6

Reads <root>/seed*/<setting>.json (benchmarks/run_frontier.sh writes them); writes <root>/report.md and
<root>/frontier.png. See docs/benchmarks/benchmarks.md, "Lossless frontier".
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from harness.frontier import write_frontier_report


@dataclass
class FrontierReportArguments:
    root: str = field(metadata={"help": "Results folder holding seed*/ (one schedule)."})
    title: str = field(default="Lossless frontier", metadata={"help": "Report title."})
    target: float = field(
        default=1.3, metadata={"help": "The wall-clock saving a strategy's largest lossless saving is checked against."}
    )


if __name__ == "__main__":
    (args,) = HfArgumentParser(FrontierReportArguments).parse_args_into_dataclasses()
    print(write_frontier_report(args.root, args.title, args.target))
