"""Time-to-accuracy benchmarks of selection strategies (the paper's Table 1 and Figure 1), and the GPU check's report.

`settings` holds what every run of a benchmark shares (`RunSettings`, which `cli.BenchmarkArguments`
extends); `runner` trains one strategy and logs test accuracy against training time after every
epoch; `logs` reads the per-strategy JSON logs, `report` turns them into markdown tables and `plots`
draws them; `cost_model` is the paper's cost model, `timing` the one timer, and `gpu_report` renders
`make gpu-check`'s report. `settings`, `logs`, `report`, `cost_model` and `gpu_report` need neither
torch nor transformers; `plots` needs matplotlib.

The harness is not in the wheel (docs/architecture.md, "What ships"): it runs from a clone, with the package
installed (`pip install -e ".[benchmarks]"`), imported as `harness` by the scripts beside it in benchmarks/ (which
Python puts on the path when it runs them) and by the tests (pytest's `pythonpath`).
"""
