"""The README's Python example is complete: it imports what exists and uses no undefined name."""

import ast
import builtins
import importlib
import importlib.util
import re
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
        "| workload | Traditional |",  # the headline table
        "accelerate launch", "push_to_hub",
        "CIFAR-10", "CIFAR-100", "SVHN", "MNIST",
        "SelectiveBackpropSFTTrainer", "scripts/train_text.py",  # the TRL pair and the text workflow
        "## Which strategy when",
    ]
    assert [phrase for phrase in needed if phrase not in text] == []
