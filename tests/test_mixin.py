"""The mixins: sb_* arguments on any TrainingArguments subclass, selection on any Trainer subclass."""

import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from tiny import TinyClassifier, make_dataset
from transformers import HfArgumentParser, Seq2SeqTrainingArguments, Trainer, TrainingArguments

from hf_selective_backprop import (
    SelectiveBackpropArguments,
    SelectiveBackpropMixin,
    SelectiveBackpropSeq2SeqConfig,
    SelectiveBackpropSeq2SeqTrainer,
)

FLAGS = ["--output_dir", "out", "--use_cpu", "--sb_strategy", "sb", "--sb_keep", "0.5", "--sb_staleness", "2"]


def test_hf_argument_parser_reads_the_seq2seq_and_the_sb_flags():
    (args,) = HfArgumentParser(SelectiveBackpropSeq2SeqConfig).parse_args_into_dataclasses(
        [*FLAGS, "--predict_with_generate", "--generation_max_length", "7"]
    )
    assert isinstance(args, Seq2SeqTrainingArguments) and isinstance(args, SelectiveBackpropArguments)
    assert (args.sb_keep, args.sb_staleness) == (0.5, 2)
    assert args.predict_with_generate and args.generation_max_length == 7
    with pytest.raises(ValueError, match=r"--sb_staleness must be an integer >= 1"):
        HfArgumentParser(SelectiveBackpropSeq2SeqConfig).parse_args_into_dataclasses([*FLAGS[:-1], "0"])


def test_the_trl_config_runs_sfts_own_post_init_then_the_sb_checks():
    pytest.importorskip("trl", reason="the SFT pair needs TRL: pip install '.[trl]'")
    from hf_selective_backprop import SelectiveBackpropSFTConfig

    (args,) = HfArgumentParser(SelectiveBackpropSFTConfig).parse_args_into_dataclasses(
        [*FLAGS, "--bf16", "false", "--pad_to_multiple_of", "8", "--completion_only_loss", "true"]
    )
    # SFTConfig.__post_init__ turned the command line's string into a number; the sb fields are there.
    assert args.pad_to_multiple_of == 8 and args.completion_only_loss and args.sb_keep == 0.5
    with pytest.raises(ValueError, match=r"--sb_keep must be in \(0, 1\]"):
        SelectiveBackpropSFTConfig("out", use_cpu=True, bf16=False, sb_keep=2.0)


@dataclass
class MyArguments(SelectiveBackpropArguments, TrainingArguments):
    my_flag: int = field(default=3, metadata={"help": "An argument of the user's own trainer."})


class MyTrainer(SelectiveBackpropMixin, Trainer):
    """A user's own Trainer subclass, with selection mixed in."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.steps_seen = getattr(self, "steps_seen", 0) + 1
        return super().training_step(model, inputs, num_items_in_batch)


def test_the_mixins_add_selection_to_a_users_own_trainer_and_arguments(output_dir):
    args = MyArguments(output_dir, use_cpu=True, report_to=[], per_device_train_batch_size=8, num_train_epochs=2,
                       save_strategy="no", disable_tqdm=True, sb_strategy="sb", sb_keep=0.5)
    trainer = MyTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(64))
    trainer.train()
    stats = trainer.sb_stats
    assert stats["selection_forwards"] == 128 and stats["backwards"] == 8 * trainer.steps_seen < 128
    assert args.my_flag == 3


def test_arguments_without_the_sb_fields_name_the_pairs_config(output_dir):
    with pytest.raises(TypeError, match="SelectiveBackpropSeq2SeqTrainer needs args with the sb_\\* fields.*"
                                        "SelectiveBackpropSeq2SeqConfig.*got Seq2SeqTrainingArguments"):
        SelectiveBackpropSeq2SeqTrainer(model=TinyClassifier(), train_dataset=make_dataset(8),
                                        args=Seq2SeqTrainingArguments(output_dir, use_cpu=True, report_to=[]))


def test_the_package_and_its_other_pairs_import_without_trl():
    script = (
        "import sys; sys.modules['trl'] = None\n"
        "import hf_selective_backprop as h\n"
        "assert 'SelectiveBackpropSFTTrainer' not in h.__all__\n"
        "assert h.SelectiveBackpropSeq2SeqTrainer and h.SelectiveBackpropMixin\n"
        "try:\n"
        "    h.SelectiveBackpropSFTTrainer\n"
        "except ImportError as error:\n"
        "    assert \"pip install 'hf-selective-backprop[trl]'\" in str(error), error\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("trainer_name", ["DPOTrainer", "RewardTrainer", "GRPOTrainer"])
def test_the_mixin_on_a_preference_or_online_trainer_is_refused_before_it_prepares_data(tmp_path, trainer_name):
    trl = pytest.importorskip("trl", reason="TRL's trainers: pip install '.[trl]'")
    base = getattr(trl, trainer_name)
    config_class = getattr(trl, trainer_name.replace("Trainer", "Config"))
    args_class = dataclass(type("PairedConfig", (SelectiveBackpropArguments, config_class), {}))

    class Selective(SelectiveBackpropMixin, base):
        pass

    args = args_class(output_dir=str(tmp_path), use_cpu=True, report_to="none", sb_strategy="sb")
    # No data at all: the refusal comes first, before the trainer would tokenize pairs or load a reward model.
    with pytest.raises(ValueError, match=rf"TRL's {trainer_name} is not supported: its batches hold paired"):
        Selective(model=TinyClassifier(), args=args)


_BUILT = []


def _counted_uniform(args):
    from hf_selective_backprop.selectors import UniformSelector

    _BUILT.append(UniformSelector(args.sb_keep_fraction))
    return _BUILT[-1]


def test_the_strategy_and_engine_are_built_once_per_training_loop(output_dir):
    from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
    from hf_selective_backprop.selectors import register_strategy

    register_strategy("test-counted", _counted_uniform)
    _BUILT.clear()
    args = SelectiveBackpropConfig(output_dir, use_cpu=True, report_to=[], per_device_train_batch_size=8,
                                   num_train_epochs=1, save_strategy="no", disable_tqdm=True,
                                   sb_strategy="test-counted", sb_keep=0.5)
    trainer = SelectiveBackpropTrainer(model=TinyClassifier(), args=args, train_dataset=make_dataset(32))
    engine = trainer.engine
    assert _BUILT == [trainer.selector] and engine.selector is trainer.selector
    trainer.get_train_dataloader()  # a loader built before training (to inspect it) starts no loop
    trainer.train()
    # The first loop runs on what construction built; its strategy is the engine's.
    assert trainer.engine is engine and len(_BUILT) == 1 and engine.stats.considered == 32
    trainer.train()
    # A second loop starts afresh: a new strategy and engine, the first loop's counters not carried over.
    assert len(_BUILT) == 2 and trainer.engine is not engine and trainer.engine.selector is _BUILT[1]
    assert trainer.engine.stats.considered == 32 and engine.stats.considered == 32


class _OutOfMemoryOnce(SelectiveBackpropMixin, Trainer):
    """Fails its first step as a CUDA allocation would: auto_find_batch_size restarts with half the batch."""

    failed = False

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self.failed:
            type(self).failed = True
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().training_step(model, inputs, num_items_in_batch)


def test_an_auto_find_batch_size_restart_selects_afresh_at_the_smaller_batch(output_dir):
    from dataclasses import replace

    from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer
    from hf_selective_backprop.selectors import register_strategy

    register_strategy("test-counted", _counted_uniform)
    _BUILT.clear()
    args = SelectiveBackpropConfig(output_dir, use_cpu=True, report_to=[], per_device_train_batch_size=8,
                                   num_train_epochs=1, save_strategy="epoch", disable_tqdm=True,
                                   auto_find_batch_size=True, sb_strategy="test-counted", sb_keep=0.5)
    trainer = _OutOfMemoryOnce(model=TinyClassifier(), args=args, train_dataset=make_dataset(64))
    first = trainer.engine
    trainer.train()
    # The failed loop's state (its first selection batch) is not carried into the restart.
    assert trainer.failed and len(_BUILT) == 2 and trainer.engine is not first
    batch = trainer.state.train_batch_size  # Accelerate's next size after the failure (0.9x in recent releases)
    assert trainer.engine.batch_size == batch < 8 and trainer.sb_stats["considered"] == 64
    assert trainer.sb_stats["backwards"] == trainer.state.global_step * batch
    # A run resumed from its checkpoint trains at the size found, as the Trainer does, from its first step.
    resumed = SelectiveBackpropTrainer(model=TinyClassifier(), args=replace(args, num_train_epochs=2),
                                       train_dataset=make_dataset(64))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.engine.batch_size == resumed.state.train_batch_size == batch
    assert resumed.state.global_step > trainer.state.global_step  # counters continue the saved run's
    assert resumed.sb_stats["backwards"] == resumed.state.global_step * batch
