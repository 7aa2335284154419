"""scripts/compare.py (make demo): any strategy with its flags, images and text, a line per run, then the table;
its --output_dir claimed as scripts/train.py claims its own, and its bad flags refused before any training."""

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from hf_selective_backprop.output_lock import claimed

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "scripts" / "compare.py"
TINY_IMAGES = ["--max_train_samples", "300", "--image_size", "16", "--num_train_epochs", "2"]
TINY_TEXT = ["--label_column", "sentiment", "--vocab_size", "80", "--hidden_size", "16", "--num_heads", "2",
             "--num_layers", "1", "--intermediate_size", "32", "--max_length", "16",
             "--per_device_train_batch_size", "16", "--num_train_epochs", "1", "--use_cpu"]


@pytest.fixture
def compare(monkeypatch):
    """compare.py's main, in this process (its text workflow imports scripts/train_text.py, beside it)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return runpy.run_path(str(COMPARE), run_name="compare")["main"]


@pytest.fixture
def no_data(monkeypatch):
    """Fails the test if a run starts loading data: bad flags and folders must be refused first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the data was loaded before the error")

    monkeypatch.setattr("hf_selective_backprop.workflow.load_image_data", refuse)


def refused(compare, capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        compare(list(argv))
    assert exit_info.value.code not in (0, None)
    message = capsys.readouterr().err if isinstance(exit_info.value.code, int) else str(exit_info.value.code)
    assert message.startswith("compare.py: error: ") and "\n" not in message.strip(), message
    return message


def stats(folder: Path) -> dict:
    return json.loads((folder / "sb_stats.json").read_text())


def test_the_demos_strategies_print_a_line_as_each_run_ends_then_the_table(tmp_path):
    # make demo's first contact: a line per run while the others train, the table, the Trainer's output in
    # train.log and nothing on stderr (the rows selection left queued at the end are said at INFO, in the log).
    out = tmp_path / "compare"
    process = subprocess.Popen(
        [sys.executable, str(COMPARE), "--strategies", "none,infobatch,uniform:0.65", *TINY_IMAGES,
         "--output_dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("[1/3] none: "):  # printed as that run ended, while the other two had yet to train
            assert not (out / "uniform-keep0.65" / "sb_stats.json").exists()
    stderr = process.stderr.read()
    assert process.wait(timeout=600) == 0, stderr[-3000:]
    assert stderr == ""
    printed = "".join(lines)
    assert [line.split(":")[0] for line in lines if line.startswith("[")] == ["[1/3] none", "[2/3] infobatch",
                                                                               "[3/3] uniform"]
    table = printed[printed.index("\ndigits, resnet18"):].strip()
    assert ("| run | test accuracy | backward passes | fewer backward passes | selection forwards | train time (s) "
            "| saving vs none |") in table
    fewer = {row.split("|")[1].strip(): row.split("|")[4].strip() for row in table.splitlines()
             if row.startswith("| ") and "x |" in row}
    # the machine-independent column: the plain run's backward passes over each run's
    assert fewer["none"] == "1.00x"
    assert fewer["uniform:0.65"] == f"{600 / stats(out / 'uniform-keep0.65')['backwards']:.2f}x"
    assert [row.split("|")[1].strip() for row in table.splitlines() if row.startswith("| ") and "---" not in row][1:] \
        == ["none", "infobatch", "uniform:0.65"]
    assert (out / "compare.md").read_text().strip() == table
    # Each run is the trainer's own strategy with its flags: InfoBatch prunes before loading, the control keeps 0.65.
    assert stats(out / "none")["backwards"] == 2 * 300
    assert stats(out / "infobatch")["strategy"] == "infobatch" and stats(out / "infobatch")["examples_loaded"] < 600
    uniform = stats(out / "uniform-keep0.65")
    assert uniform["strategy"] == "uniform" and uniform["kept_fraction"] == pytest.approx(0.65, abs=0.05)
    own_warnings = re.findall(r"hf_selective_backprop/\S+\.py:\d+: \w*Warning.*", (out / "train.log").read_text())
    assert own_warnings == []


def test_text_runs_train_as_scripts_train_text_does(compare, review_folder, tmp_path, capsys):
    out = tmp_path / "text"
    compare(["--workflow", "text", "--dataset", str(review_folder), *TINY_TEXT, "--num_train_epochs", "2",
             "--strategies", "none,sb:0.5:sb_staleness=2", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    assert "| run | validation accuracy |" in printed and "| sb:0.5:sb_staleness=2 |" in printed
    assert re.search(r"^\[2/2\] sb:0\.5:sb_staleness=2: accuracy \d\.\d{4}, ", printed, re.MULTILINE)
    stale = stats(out / "sb-keep0.5-staleness2")
    assert stale["strategy"] == "sb" and stale["stale_lookups"] > 0 and stats(out / "none")["backwards"] == 2 * 96
    assert (out / "sb-keep0.5-staleness2" / "tokenizer.json").is_file()  # the text workflow's own files


def test_help_lists_its_own_flags_then_the_workflows(compare, capsys):
    for workflow, own in (("image", "--dataset DATASET"), ("text", "--task {text-classification,causal-lm}")):
        with pytest.raises(SystemExit):
            compare(["--workflow", workflow, "--help"])
        shown = capsys.readouterr().out
        flags = [shown.index(f"\n  {flag}") for flag in ("--strategies", own, "--sb_strategy", "--output_dir")]
        assert flags == sorted(flags)
        assert len(shown.split("options:")[0].splitlines()) < 5  # a short usage, not every Trainer flag


@pytest.mark.parametrize(("argv", "message"), [
    (["--strategies", ","], r"--strategies ',' names an empty run: give comma-separated strategies such as "
                            r"none,infobatch,uniform:0\.65"),
    (["--strategies", "none,sb,sb"], r"--strategies names the run 'sb' twice: each run trains into a folder of "
                                     r"its own \(.*/sb\)"),
    (["--num_train_epochs", "0"], r"--num_train_epochs must be > 0 \(or set --max_steps\), got 0: the runs would "
                                  r"train nothing"),
    (["--sb_keep", "0"], r"--sb_keep must be in \(0, 1\], got 0\.0"),
    (["--strategies", "none,uniform:0"], r"--strategies entry 'uniform:0': --sb_keep must be in \(0, 1\], got 0\.0"),
    (["--strategies", "sb:staleness=3"], r"--strategies entry 'sb:staleness=3': 'staleness=3' is neither a kept "
                                         r"fraction nor an sb_\* flag"),
    (["--strategies", "infobatch:sb_prune_ratio=half"], r"--strategies entry 'infobatch:sb_prune_ratio=half': "
                                                        r"argument --sb_prune_ratio.*invalid float value: 'half'"),
    (["--strategies", "none,bogus"], r"--strategies entry 'bogus': --sb_strategy must be one of none, sb, "),
    (["--strategies", ":0.5"], r"--strategies entry ':0\.5' names no --sb_strategy"),
    (["--sb_strategy", "sb"], r"--sb_strategy: each run's strategy is an entry of --strategies"),
], ids=["empty", "twice", "no-epochs", "keep", "entry-keep", "unknown-flag", "entry-value", "unknown-strategy",
        "no-strategy", "sb_strategy"])
def test_bad_flags_are_refused_naming_compares_own_before_anything_is_written(compare, capsys, no_data, tmp_path,
                                                                               argv, message):
    out = tmp_path / "compare"
    assert re.search(message, refused(compare, capsys, *argv, "--output_dir", str(out)))
    assert not out.exists()


def test_a_folder_holding_anything_is_refused_without_the_flag_and_left_as_it_is(compare, capsys, no_data, tmp_path):
    # A plausible way in: scripts/train.py --output_dir outputs/sb, then compare.py --output_dir outputs.
    out = tmp_path / "outputs"
    (out / "sb").mkdir(parents=True)
    (out / "sb" / "model.safetensors").write_bytes(b"the user's weights")
    (out / "train.log").write_text("the user's log")
    (out / "compare.md").write_text("the user's table")
    message = refused(compare, capsys, "--strategies", "none,sb", "--output_dir", str(out))
    assert re.search(r"--output_dir '.*outputs' already holds files \(compare\.md, sb, train\.log\), which a new run "
                     r"would overwrite\. Pass --overwrite_output_dir", message)
    assert (out / "sb" / "model.safetensors").read_bytes() == b"the user's weights"
    assert (out / "train.log").read_text() == "the user's log"
    assert (out / "compare.md").read_text() == "the user's table"
    assert sorted(path.name for path in out.iterdir()) == ["compare.md", "sb", "train.log"]


@pytest.mark.parametrize("link", ["train.log", "compare.md", "none"])
def test_a_symbolic_link_where_it_writes_is_refused_even_with_the_flag(compare, capsys, no_data, tmp_path, link):
    out, outside = tmp_path / "outputs", tmp_path / "elsewhere"
    out.mkdir()
    outside.write_text("the user's own file")
    (out / link).symlink_to(outside)
    message = refused(compare, capsys, "--strategies", "none,sb", "--overwrite_output_dir", "--output_dir", str(out))
    assert f"{out / link} is a symbolic link, which this script would write through" in message
    assert outside.read_text() == "the user's own file" and (out / link).is_symlink()


def test_an_output_dir_that_is_a_file_or_in_use_is_refused(compare, capsys, no_data, tmp_path):
    mine = tmp_path / "results.txt"
    mine.write_text("the user's own file")
    assert "is a file, not a folder" in refused(compare, capsys, "--output_dir", str(mine))
    assert mine.read_text() == "the user's own file"
    busy = tmp_path / "busy"
    with claimed(str(busy)):  # another run holds it
        assert "is in use by another run" in refused(compare, capsys, "--output_dir", str(busy))
    assert not (busy / "train.log").exists()


def test_make_demos_flags_are_compare_pys(compare, capsys):
    # `make demo` runs compare.py with the Makefile's DEMO_FLAGS: every one must be a flag of the text workflow (a
    # flag renamed there would fail the demo only when run). Zero epochs stop it once every flag has parsed.
    makefile = (ROOT / "Makefile").read_text()
    flags = re.search(r"^DEMO_FLAGS := (.*?)\n(?=\S)", makefile, re.M | re.S).group(1)
    argv = flags.replace("\\\n", " ").replace("$(DEMO_DATA)", "stanfordnlp/sst2").split()
    assert "--model_name_or_path" in argv and "sentence-transformers/all-MiniLM-L6-v2" in argv
    message = refused(compare, capsys, *argv, "--num_train_epochs", "0")
    assert "--num_train_epochs must be > 0" in message, message
