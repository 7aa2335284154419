"""`--help` a person reads: the scripts' own flags, then the sb_* flags, then the Trainer's under a title, and help
strings that say what a flag does without benchmark figures (those live in docs/results.md)."""

from __future__ import annotations

import dataclasses
import re
import runpy
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser, TrainingArguments

from hf_selective_backprop import SelectiveBackpropConfig
from hf_selective_backprop.cli import SELECTION_FLAGS, group_flags
from hf_selective_backprop.config import SelectiveBackpropArguments
from hf_selective_backprop.data import DataArguments
from hf_selective_backprop.models import ModelArguments
from hf_selective_backprop.workflow import OutputArguments

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ["train.py", "train_text.py", "train_sft.py", "pretrain_lm.py", "compare.py", "train_tokenizer.py"]
#: Each script's first own flag and the title its Trainer's flags go under (None: it has no training arguments).
FIRST_OWN_FLAG = {"train.py": "--model", "train_text.py": "--model_name_or_path",
                  "train_sft.py": "--model_name_or_path", "pretrain_lm.py": "--dataset", "compare.py": "--strategies",
                  "train_tokenizer.py": "--output_dir"}
TRAINING_ARGUMENTS = "transformers' TrainingArguments flags:"
TRAINER_TITLE = {"train.py": TRAINING_ARGUMENTS, "train_text.py": TRAINING_ARGUMENTS,
                 "train_sft.py": "trl's SFTConfig flags:", "pretrain_lm.py": TRAINING_ARGUMENTS,
                 "compare.py": TRAINING_ARGUMENTS, "train_tokenizer.py": None}
SELECTION_TITLE = "selection flags (sb_*, and the step decay of any schedule):"

#: What a measured result looks like in text: a speed-up (1.49x, 2x), a percentage (94.36 %), a difference in
#: points (7 points, 0.4-0.5 points), a spread (± 0.2).
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?\s+points?\b|±")


def figures_in(text: str) -> list[str]:
    return [match.group(0) for match in FIGURE.finditer(text)]


def help_text(script: str, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # compare.py imports train_text.py beside it
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__")
    assert stopped.value.code in (0, None)
    return capsys.readouterr().out


def option_line(text: str, flag: str) -> int:
    """The index of the line of ``text`` that lists ``flag`` as an option (not its mention in the usage)."""
    lines = text.splitlines()
    return next(i for i, line in enumerate(lines) if re.match(rf"  {re.escape(flag)}\b", line))


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_scripts_flags_then_the_sb_flags_then_the_trainers_under_a_title(script, monkeypatch, capsys):
    text = help_text(script, monkeypatch, capsys)
    lines = text.splitlines()
    own = option_line(text, FIRST_OWN_FLAG[script])
    title = TRAINER_TITLE[script]
    if title is None:  # no training arguments: nothing to regroup
        assert SELECTION_TITLE not in lines
        return
    trainer = lines.index(title)
    assert own < trainer < option_line(text, "--output_dir") and option_line(text, "--learning_rate") > trainer
    if script == "pretrain_lm.py":  # plain TrainingArguments: no selection flags
        assert SELECTION_TITLE not in lines and "--sb_strategy" not in text
        return
    selection = lines.index(SELECTION_TITLE)
    first_sb = option_line(text, "--sb_strategy")
    assert own < selection < first_sb < trainer < option_line(text, "--output_dir")
    sb_lines = [option_line(text, f"--{name}") for name in sorted(SELECTION_FLAGS)]
    assert all(selection < line < trainer for line in sb_lines)  # every one of them, the step decay's included
    if script != "compare.py":  # compare.py keeps its own usage line
        usage = text[: text.index("\n\n")]
        assert usage.rstrip().endswith("TrainingArguments flags]" if script != "train_sft.py" else "SFTConfig flags]")
        assert "--sb_strategy" not in usage and "--learning_rate" not in usage
    assert len(lines) < 1000


def test_grouping_changes_the_help_and_nothing_that_is_parsed():
    types = (ModelArguments, DataArguments, OutputArguments, SelectiveBackpropConfig)
    plain, grouped = HfArgumentParser(types), group_flags(HfArgumentParser(types))
    assert plain._actions is not grouped._actions and [a.dest for a in plain._actions] == [
        a.dest for a in grouped._actions]
    argv = ["--dataset", "digits", "--output_dir", "out", "--sb_strategy", "sb", "--sb_keep", "0.5",
            "--learning_rate", "0.05", "--no_sb_record", "--augment", "False", "--lr_decay_milestones", "0.5", "0.8",
            "--use_cpu"]
    assert plain.parse_args(argv) == grouped.parse_args(argv)
    parsed = grouped.parse_args_into_dataclasses(argv)
    assert parsed[3].sb_keep == 0.5 and parsed[3].sb_record is False and parsed[3].lr_decay_milestones == [0.5, 0.8]
    for bad in (["--sb_keep", "x"], ["--no_such_flag"]):
        with pytest.raises(SystemExit):
            grouped.parse_args(["--output_dir", "out", *bad])
    plain_only = HfArgumentParser(DataArguments)
    assert group_flags(plain_only) is plain_only and plain_only.usage is None  # no training arguments: untouched


def own_help_strings() -> dict[str, str]:
    """Every help string of a flag this project declares: the sb_* fields and each script's own dataclasses (not
    transformers' or TRL's fields)."""
    types = {SelectiveBackpropArguments}
    for script in SCRIPTS:
        names = runpy.run_path(str(ROOT / "scripts" / script), run_name="help_strings")
        types |= {value for value in names.values() if isinstance(value, type) and dataclasses.is_dataclass(value)
                  and not issubclass(value, TrainingArguments)}
    helps = {}
    for dtype in types:
        for field in dataclasses.fields(dtype):
            if "help" in field.metadata:
                helps[f"{dtype.__name__}.{field.name}"] = field.metadata["help"]
    return helps


def test_the_figure_pattern_finds_measured_results_and_not_settings():
    assert figures_in("1.49x less time, 94.36 % accurate, 7 points more, 0.4-0.5 points below, 93.8 ± 0.2") == [
        "1.49x", "94.36 %", "7 points", "0.5 points", "±"]
    assert figures_in("2x the epochs; 0-20% noise") == ["2x", "20%"]
    assert not figures_in("presample x batch, 8x8 digits, 32x32 networks, keep 1/3, delta 0.875, beta=2")


def test_help_strings_say_what_a_flag_does_without_benchmark_figures(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    helps = own_help_strings()
    assert "SelectiveBackpropArguments.sb_strategy" in helps and "CompareArguments.strategies" in helps
    assert "SFTDataArguments.dataset" in helps and "PretrainArguments.objective" in helps
    with_figures = {name: figures_in(text) for name, text in helps.items() if figures_in(text)}
    assert not with_figures, f"benchmark figures in help strings (move them to docs/results.md): {with_figures}"
    # argparse formats a help string with %: a lone '%' (as in '20 % noise') printed a dict in its place.
    stray = [name for name, text in helps.items() if re.search(r"%(?![(%])", text)]
    assert not stray, f"a lone '%' in help strings (write '%%'): {stray}"
