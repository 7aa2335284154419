"""DeepSpeed's accelerator notice, kept to the runs DeepSpeed trains.

Importing DeepSpeed detects the machine's accelerator and, finding none, logs "Setting accelerator to CPU. If you
have GPU or other accelerator, we were unable to detect it." Accelerate imports DeepSpeed wherever it is installed,
the first time a Trainer unwraps its model, so every CPU run in an environment that has DeepSpeed printed that line,
whether DeepSpeed trained or not (the stock Trainer too). Setting ``DS_ACCELERATOR=cpu`` would silence it, and would
also override DeepSpeed's own detection of an accelerator; this drops that one line, only while a trainer that does
not use DeepSpeed is built, and changes nothing DeepSpeed decides.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from accelerate.utils import parse_flag_from_env

#: The start of the line DeepSpeed logs when it finds no accelerator.
NOTICE = "Setting accelerator to CPU"
#: The logger DeepSpeed logs it to.
DEEPSPEED_LOGGER = "DeepSpeed"


class _DropNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(NOTICE)


def uses_deepspeed(args) -> bool:
    """Whether a run with these TrainingArguments trains with DeepSpeed: a config given, or `accelerate launch
    --use_deepspeed` (its environment flag)."""
    return bool(getattr(args, "deepspeed", None)) or parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")


@contextlib.contextmanager
def quiet_unless_deepspeed(args) -> Iterator[None]:
    """Drops DeepSpeed's no-accelerator line while the block runs, unless ``args`` train with DeepSpeed."""
    if uses_deepspeed(args):
        yield
        return
    logger, notice = logging.getLogger(DEEPSPEED_LOGGER), _DropNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)
