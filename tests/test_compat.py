"""The Trainer's private surface stays in `_compat.py` and the hook overrides; the loss-scale rule matches upstream."""

import inspect
import re
from pathlib import Path

import pytest
import torch
import transformers.trainer
import transformers.training_args
from tiny import TinyClassifier, make_config, make_dataset
from transformers import Trainer, TrainingArguments

from hf_selective_backprop import SelectiveBackpropTrainer, _compat

PACKAGE = Path(_compat.__file__).resolve().parent
#: The modules that may name the Trainer's private members: the hook overrides, and the compat module.
ALLOWED = {"trainer.py", "_compat.py"}


def _uses(names) -> dict[str, list[str]]:
    """``{name: ["path:line", ...]}`` for each of ``names`` that a module of the package names (code or text)."""
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\b")
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in pattern.findall(line):
                found.setdefault(name, []).append(f"{path.relative_to(PACKAGE)}:{number}")
    return found


def _trainer_private_names() -> set[str]:
    """The private members of transformers' Trainer and TrainingArguments: their methods and class attributes,
    and the attributes their code sets on ``self``."""
    names = set()
    for cls, module in ((Trainer, transformers.trainer), (TrainingArguments, transformers.training_args)):
        names |= set(dir(cls))
        names |= set(re.findall(r"self\.(_\w+)", inspect.getsource(module)))
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_the_listed_private_names_are_the_trainers():
    assert _compat.TRAINER_PRIVATE_NAMES <= _trainer_private_names()
    assert all(why and replacement for why, replacement in _compat.PRIVATE_SURFACE.values())


def test_private_trainer_names_appear_only_in_the_hook_overrides_and_compat():
    outside = {name: [where for where in places if where.split(":")[0] not in ALLOWED]
               for name, places in _uses(_compat.TRAINER_PRIVATE_NAMES).items()}
    outside = {name: places for name, places in outside.items() if places}
    assert not outside, f"go through hf_selective_backprop._compat instead: {outside}"


def test_every_private_trainer_name_the_package_uses_is_listed_in_compat():
    unlisted = {name: places for name, places in _uses(_trainer_private_names()).items()
                if name not in _compat.TRAINER_PRIVATE_NAMES}
    assert not unlisted, f"list these in _compat.PRIVATE_SURFACE (why, public replacement) or rename them: {unlisted}"


def _weighted_trainer(output_dir, **overrides):
    return SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(16),
                                    args=make_config(output_dir, sb_strategy="infobatch", **overrides))


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("accepts_loss_kwargs", [True, False])
def test_the_loss_scale_rule_agrees_with_the_installed_trainer(output_dir, average, accepts_loss_kwargs):
    trainer = _weighted_trainer(output_dir, average_tokens_across_devices=average)
    trainer.model_accepts_loss_kwargs = accepts_loss_kwargs  # a causal LM's loss takes num_items_in_batch
    _compat.TRAINER_LOSS_SCALE.check(trainer)
    assert trainer.loss_scale_rule.factor(trainer, torch.tensor(3)) == 1  # one process
    # The check sees the factor upstream applies on several processes: a rule without it is refused.
    unscaled = _compat.LossScale("Trainer.compute_loss", lambda: Trainer.compute_loss, lambda trainer, items: 1)
    if average and accepts_loss_kwargs:
        with pytest.raises(RuntimeError, match=r"multiplies the loss by 6 on 6 processes .* expects 1"):
            unscaled.check(trainer)
    else:
        unscaled.check(trainer)


def test_an_upstream_that_scales_the_loss_otherwise_is_refused_at_construction(output_dir, monkeypatch):
    compute_loss = Trainer.compute_loss

    def scaled_twice(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
        return loss * self.accelerator.num_processes if num_items_in_batch is not None else loss

    monkeypatch.setattr(Trainer, "compute_loss", scaled_twice)
    with pytest.raises(RuntimeError, match="scales the loss differently.*would be mis-scaled"):
        _weighted_trainer(output_dir)
    # A strategy without loss weights never applies the factor, so it is not refused.
    SelectiveBackpropTrainer(model=TinyClassifier(), train_dataset=make_dataset(16),
                             args=make_config(output_dir, sb_strategy="sb"))


def test_the_training_values_are_named_and_their_count_checked():
    values = _compat.training_values((1, 2, 3, 4, 5, 6, 7))
    assert (values.num_train_epochs, values.steps_in_epoch, values.max_steps) == (1, 6, 7)
    with pytest.raises(RuntimeError, match="returned 8 values where hf_selective_backprop expects 7"):
        _compat.training_values(tuple(range(8)))


def test_the_sft_loss_scale_rule_agrees_with_the_installed_trl(output_dir):
    pytest.importorskip("trl", reason="the SFT pair needs TRL")
    from sft_data import language_modelling, sft_model, sft_tokenizer

    from hf_selective_backprop import SelectiveBackpropSFTConfig, SelectiveBackpropSFTTrainer

    tokenizer = sft_tokenizer()
    args = SelectiveBackpropSFTConfig(output_dir, sb_strategy="infobatch", report_to=[], use_cpu=True, bf16=False,
                                      max_length=32, dataset_num_proc=None, average_tokens_across_devices=True)
    trainer = SelectiveBackpropSFTTrainer(model=sft_model(tokenizer), args=args, train_dataset=language_modelling(8),
                                          processing_class=tokenizer)  # the construction ran the check
    metrics = {mode: dict(values) for mode, values in trainer._metrics.items()}
    _compat.SFT_LOSS_SCALE.check(trainer)
    assert {mode: dict(values) for mode, values in trainer._metrics.items()} == metrics  # the probe logs nothing
    unscaled = _compat.LossScale("SFTTrainer.compute_loss", _compat.SFT_LOSS_SCALE.upstream, lambda trainer, items: 1)
    with pytest.raises(RuntimeError, match=r"multiplies the loss by 6 on 6 processes"):
        unscaled.check(trainer)


@pytest.mark.parametrize("distribution", sorted(_compat.NEWEST_TESTED))
def test_a_release_newer_than_the_newest_tested_gets_one_warning_naming_both(distribution):
    newest = _compat.NEWEST_TESTED[distribution]
    newer = f"{newest.major}.{newest.minor + 1}.0"
    with pytest.warns(UserWarning) as caught:
        _compat.warn_if_newer_than_tested(distribution, newer)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{distribution} {newer} is newer than" in message and f"tested with ({newest})" in message


@pytest.mark.parametrize("distribution", sorted(_compat.NEWEST_TESTED))
def test_a_tested_or_older_release_gets_no_warning(distribution, recwarn):
    newest = _compat.NEWEST_TESTED[distribution]
    for release in (str(newest), f"{newest.major}.{newest.minor - 1}.0"):
        _compat.warn_if_newer_than_tested(distribution, release)
    assert [str(w.message) for w in recwarn] == []


@pytest.mark.parametrize("distribution", sorted(_compat.NEWEST_TESTED))
def test_a_version_string_that_is_no_version_is_taken_for_the_newest_tested_with_a_warning(distribution):
    # packaging's InvalidVersion stopped the package's import.
    with pytest.warns(UserWarning) as caught:
        release = _compat.warn_if_newer_than_tested(distribution, "not-a-version")
    assert release == _compat.NEWEST_TESTED[distribution]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{distribution} gives its version as 'not-a-version', which is not a version number" in message


@pytest.mark.parametrize("faked", [("99.0.0", "98.0.0"), None, ("not-a-version", "not-a-version")],
                         ids=["newer", "tested", "not-a-version"])
def test_importing_the_trainers_warns_once_per_newer_release(faked, tmp_path):
    """The check runs where the package imports transformers (and TRL): with both faked newer, one warning each,
    however many trainers are built; with the installed (tested) releases, none; with version strings that are no
    versions, one warning each, and the package imports (it failed with packaging's InvalidVersion)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import sys, warnings
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        warnings.simplefilter("always")
        import trl
        from transformers import Trainer  # replaces sys.modules["transformers"]: fake the version after it
        from trl import SFTTrainer  # TRL reads transformers' version itself when its trainer is imported
        if {faked is not None}:
            sys.modules["transformers"].__version__, sys.modules["trl"].__version__ = {faked!r}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from hf_selective_backprop import SelectiveBackpropTrainer
            from hf_selective_backprop.sft import SelectiveBackpropSFTTrainer
            from tiny import TinyClassifier, make_config, make_dataset
            for run in ("a", "b"):
                SelectiveBackpropTrainer(model=TinyClassifier(), args=make_config({str(tmp_path)!r} + run),
                                         train_dataset=make_dataset(32))
        for w in caught:
            if "newer than the newest release" in str(w.message) or "not a version number" in str(w.message):
                print("WARNING", w.message)
        print("done")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("done"), result.stderr[-3000:]
    warned = [line for line in result.stdout.splitlines() if line.startswith("WARNING")]
    if faked is None:
        assert warned == []
    elif faked[0] == "not-a-version":
        assert len(warned) == 2, warned
        assert "transformers gives its version as 'not-a-version'" in warned[0] + warned[1]
        assert "trl gives its version as 'not-a-version'" in warned[0] + warned[1]
    else:
        assert len(warned) == 2, warned
        assert "transformers 99.0.0" in warned[0] + warned[1] and "(5.24.0)" in warned[0] + warned[1]
        assert "trl 98.0.0" in warned[0] + warned[1] and "(1.16.0)" in warned[0] + warned[1]
