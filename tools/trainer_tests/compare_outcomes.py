"""Outcomes of the same tests under several configurations (junit XML files, the first the reference): counts per
file and every test that passes in the first and not in another.

    python tools/trainer_tests/compare_outcomes.py stock.xml none.xml default.xml
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter


def outcomes(path: str) -> dict[str, str]:
    """Test id -> passed, failed, skipped or error."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((kind for kind in ("failure", "error", "skipped") if kind in kinds), "passed")
        found[f"{case.get('classname')}::{case.get('name')}"] = {"failure": "failed"}.get(outcome, outcome)
    return found


def main(paths: list[str]) -> None:
    runs = {os.path.splitext(os.path.basename(path))[0]: outcomes(path) for path in paths}
    names = list(runs)
    print("| test class | " + " | ".join(f"{name}: passed/failed/skipped/error" for name in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    files = sorted({test.split("::")[0] for run in runs.values() for test in run})  # by test class
    for file in files:
        cells = []
        for name in names:
            counts = Counter(outcome for test, outcome in runs[name].items() if test.split("::")[0] == file)
            cells.append("/".join(str(counts[kind]) for kind in ("passed", "failed", "skipped", "error")))
        print(f"| {file} | " + " | ".join(cells) + " |")
    reference = runs[names[0]]
    for name in names[1:]:
        lost = sorted(test for test, outcome in reference.items()
                      if outcome == "passed" and runs[name].get(test) != "passed")
        print(f"\npassed under {names[0]}, not under {name}: {len(lost)}")
        for test in lost:
            print(f"- {test}")


if __name__ == "__main__":
    main(sys.argv[1:])
