"""What the console shows of the training logs: the few ``sb/*`` counters a person reads.

Every ``sb/*`` counter of a log goes to its history, to the integrations (``report_to``) and to sb_stats.json at
the end; the lines the Trainer prints (under its progress bar, or `PrinterCallback`'s with ``disable_tqdm``) show
these only, beside the loss and learning rate: a dozen counters on every line, some always 0, buried them.
"""

from __future__ import annotations

from transformers.trainer_callback import PrinterCallback, ProgressCallback

#: The sb/* keys the console shows: the share of the considered examples kept, the backward passes and the
#: selection forwards (their cost), and for a budget the share of the full run's cost spent.
SHOWN = ("sb/kept_fraction", "sb/backwards", "sb/selection_forwards", "sb/budget_spent")


def console_view(logs: dict) -> dict:
    return {key: value for key, value in logs.items() if not key.startswith("sb/") or key in SHOWN}


class SelectionProgressCallback(ProgressCallback):
    """`ProgressCallback`, printing `console_view` of each log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return super().on_log(args, state, control, logs=console_view(logs or {}), **kwargs)


class SelectionPrinterCallback(PrinterCallback):
    """`PrinterCallback`, printing `console_view` of each log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        # PrinterCallback takes total_flos out of the logs themselves, which train() then returns without it.
        logs.pop("total_flos", None)
        return super().on_log(args, state, control, logs=console_view(logs), **kwargs)


def show_fewer_counters(trainer) -> None:
    """Put the callbacks above in the place of the Trainer's own console callbacks (a subclass of them a user
    added is left as it is)."""
    callbacks = trainer.callback_handler.callbacks
    for position, callback in enumerate(callbacks):
        if type(callback) is ProgressCallback:
            callbacks[position] = SelectionProgressCallback(callback.max_str_len)
        elif type(callback) is PrinterCallback:
            callbacks[position] = SelectionPrinterCallback()
