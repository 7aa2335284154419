"""docs/flags.md is what tools/gen_flags_doc.py makes of SelectiveBackpropConfig, and documents every field
SelectiveBackpropArguments adds (the sb_* flags and the step-decay flags)."""

import dataclasses
import runpy
from pathlib import Path

from hf_selective_backprop import SelectiveBackpropConfig

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = runpy.run_path(str(ROOT / "tools" / "gen_flags_doc.py"))
REGENERATE = "run `python tools/gen_flags_doc.py` to regenerate docs/flags.md"


def sb_field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(SelectiveBackpropConfig) if f.name.startswith(("sb_", "lr_decay_"))]


def test_committed_flags_page_is_the_generated_one():
    committed = (ROOT / "docs" / "flags.md").read_text()
    assert committed == GENERATOR["render"](), f"docs/flags.md differs from SelectiveBackpropConfig: {REGENERATE}"


def test_every_sb_field_has_help_and_a_row_on_the_page():
    fields = {f.name: f for f in dataclasses.fields(SelectiveBackpropConfig)}
    names = sb_field_names()
    assert "sb_strategy" in names and "sb_keep" in names  # the filter finds the fields at all
    no_help = [name for name in names if not fields[name].metadata.get("help", "").strip()]
    assert not no_help, f"sb_* fields without a help string (the flag table and --help show nothing): {no_help}"
    page = (ROOT / "docs" / "flags.md").read_text()
    missing = [name for name in names if f"| `--{name}` |" not in page]
    assert not missing, f"docs/flags.md has no row for {missing}: {REGENERATE}"


def test_rows_carry_the_fields_defaults_and_choices():
    rendered = GENERATOR["render"]()
    assert "| `--sb_strategy` | `str` | `infobatch` |" in rendered
    assert "| `--sb_keep` | `float \\| None` | unset |" in rendered  # '|' escaped, or it would end the cell
    assert "One of: `eval`, `train`." in rendered  # sb_selection_mode's choices
    assert "CDF(loss)\\*\\*beta" in rendered  # '**' escaped, not rendered as bold
