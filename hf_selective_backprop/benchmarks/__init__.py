"""Time-to-accuracy benchmarks of selection strategies (the paper's Table 1 and Figure 1).

`runner` trains one strategy and logs test accuracy against training time after every
epoch; `logs` reads the per-strategy JSON logs, `report` turns them into markdown tables and
`plots` draws them. `logs`, `report` and `plots` need only the JSON logs (no torch, no
transformers); `plots` needs matplotlib, from the optional `benchmarks` extra:
`pip install "hf-selective-backprop[benchmarks]"`.
"""
