"""`--help` a person reads: a script's own flags first, then the `sb_*` flags, then the Trainer's.

`HfArgumentParser` adds every field of every dataclass to one list of options, and a `SelectiveBackpropConfig`
lists the fields of `TrainingArguments` (its last base) before its own, so the `sb_*` flags came last, after
some hundred flags of the Trainer. `group_flags` moves them, once the parser is built, into titled groups:

    parser = group_flags(HfArgumentParser((ModelArguments, DataArguments, OutputArguments, SelectiveBackpropConfig)))

Only the help changes: argparse parses from the parser's own list of actions, which stays as it was.
"""

from __future__ import annotations

import argparse
import dataclasses

from transformers import TrainingArguments

from .config import SelectiveBackpropArguments

#: The `sb_*` flags and the step-decay flags: the fields `SelectiveBackpropArguments` adds to `TrainingArguments`.
SELECTION_FLAGS = frozenset(field.name for field in dataclasses.fields(SelectiveBackpropArguments))


def group_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Regroup ``parser``'s help (an `HfArgumentParser`): its other dataclasses' flags stay first, under
    "options"; the fields of `SelectiveBackpropArguments` follow under a title of their own, then the rest of the
    training arguments' dataclass (`TrainingArguments`, or a subclass such as TRL's `SFTConfig`) under a title
    that says whose they are. The usage line lists the script's own flags and names the two groups. A parser
    without a training-arguments dataclass is returned as it was. Returns ``parser``."""
    trainer_types = [dtype for dtype in getattr(parser, "dataclass_types", ())
                     if isinstance(dtype, type) and issubclass(dtype, TrainingArguments)]
    if not trainer_types:
        return parser
    config_type = trainer_types[-1]
    config_fields = {field.name for field in dataclasses.fields(config_type) if field.init}
    selection = config_fields & SELECTION_FLAGS
    base = next(cls for cls in config_type.__mro__ if issubclass(cls, TrainingArguments)
                and not issubclass(cls, SelectiveBackpropArguments))
    owner = base.__module__.split(".")[0]
    if base is TrainingArguments:
        title = "transformers' TrainingArguments flags"
        description = "Every remaining flag is a field of transformers.TrainingArguments"
    else:
        title = f"{owner}'s {base.__name__} flags"
        description = f"Every remaining flag is a field of {owner}'s {base.__name__} (transformers.TrainingArguments " \
                      "and its own)"
    description += ", the Trainer's settings, as their documentation describes them."
    groups = []
    if selection:
        groups.append((parser.add_argument_group(
            "selection flags (sb_*, and the step decay of any schedule)",
            "The fields SelectiveBackpropConfig adds to the training arguments: which examples each step trains "
            "on, and how the learning rate steps down."), selection))
    groups.append((parser.add_argument_group(title, description), config_fields - selection))
    own = []
    for group in parser._action_groups:
        if any(group is new for new, _ in groups):
            continue
        kept = []
        for action in group._group_actions:
            target = next((new for new, names in groups if action.dest in names), None)
            if target is None:
                kept.append(action)
            else:
                target._group_actions.append(action)
        group._group_actions[:] = kept
        own += [action for action in kept if action.option_strings]
    if parser.usage is None:
        parser.usage = _usage(parser, own, f"[{'sb_* flags] [' if selection else ''}{base.__name__} flags]")
    return parser


def _usage(parser: argparse.ArgumentParser, actions: list[argparse.Action], tail: str) -> str:
    """The usage argparse would print for ``actions`` alone, then ``tail``: the Trainer's hundred flags named as
    one group instead of listed one by one."""
    formatter = parser._get_formatter()
    formatter.add_usage(None, actions, [])
    usage = formatter.format_help().strip().removeprefix("usage: ")
    indent = " " * (len("usage: ") + len(parser.prog) + 1)
    return f"{usage}\n{indent}{tail}".replace("%", "%%")
