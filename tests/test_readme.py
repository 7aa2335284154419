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
