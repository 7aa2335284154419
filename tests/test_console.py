"""What a person sees while a run trains: the few sb/* counters on each log line, and a progress bar whose total
does not move back and forth."""

import ast

import pytest
from tiny import TinyClassifier, make_config, make_dataset
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from hf_selective_backprop import SelectiveBackpropTrainer
from hf_selective_backprop.engine.console import SHOWN


class Logged(TrainerCallback):
    """An integration's view: every log as the Trainer hands it over."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


@pytest.mark.parametrize("bar", [False, True], ids=["printer", "progress-bar"])
def test_the_console_shows_the_counters_a_person_reads_and_the_integrations_get_every_one(output_dir, capsys, bar):
    integration = Logged()
    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), train_dataset=make_dataset(), callbacks=[integration],
        args=make_config(output_dir, sb_strategy="sb", sb_staleness=2, logging_steps=4, disable_tqdm=not bar),
    )
    trainer.train()
    printed = [ast.literal_eval(line[line.index("{"):]) for line in capsys.readouterr().out.splitlines()
               if line.lstrip().startswith("{") and "'loss'" in line]
    assert printed, "no training log line was printed"
    for line in printed:
        assert {key for key in line if key.startswith("sb/")} == {"sb/kept_fraction", "sb/backwards",
                                                                   "sb/selection_forwards"}, line
    training_logs = [logs for logs in integration.logs if "loss" in logs]
    assert len(training_logs) == len(printed)
    for logs in (*training_logs, *(entry for entry in trainer.state.log_history if "loss" in entry)):
        assert {"sb/examples_seen", "sb/stale_lookups", "sb/optimizer_steps", *SHOWN[:3]} <= set(logs), logs


@pytest.mark.parametrize(("strategy", "epochs", "rows"), [("kath18", 3, 256), ("sb", 3, 512)],
                         ids=["more-than-expected", "fewer"])
def test_the_progress_bars_total_never_goes_back_while_the_run_goes_on(output_dir, strategy, epochs, rows):
    # Kath18 here takes 18 steps of 16 expected, SB 19 of 32: the total stays at the expected steps while the run
    # goes on, rises one step at a time past them, and ends at the steps taken.
    totals = []

    class Totals(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            totals.append(self.total())

        def on_train_end(self, args, state, control, **kwargs):
            totals.append(self.total())

        def total(self):
            bar = next(c for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback))
            return bar.training_bar.total

    trainer = SelectiveBackpropTrainer(
        model=TinyClassifier(), train_dataset=make_dataset(rows), callbacks=[Totals()],
        args=make_config(output_dir, sb_strategy=strategy, sb_keep=1 / 3 if strategy == "sb" else None,
                         num_train_epochs=epochs, per_device_train_batch_size=16, disable_tqdm=False),
    )
    trainer.train()
    steps, expected = trainer.state.global_step, trainer.sb_stats["expected_steps"]
    assert len(totals) == steps + 1 and totals[-1] == steps and (steps > expected) == (strategy == "kath18")
    during = totals[:-2]  # the last step's may be the end already
    assert during == sorted(during) and during[0] == expected, totals
