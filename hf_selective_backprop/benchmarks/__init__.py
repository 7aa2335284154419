"""Time-to-accuracy benchmarks of selection strategies (the paper's Table 1 and Figure 1).

`runner` trains one strategy and logs test accuracy against training time after every
epoch; `report` turns the per-strategy JSON logs into markdown tables; `plots` draws them.
`report` and `plots` need only the JSON logs (no torch, no transformers).
"""
