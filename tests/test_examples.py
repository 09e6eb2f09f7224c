"""Every script in examples/ runs to completion (each asserts its own result), and what it
writes on stderr is the shim's alone: other libraries' notices are silenced in the examples."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))
NEEDS = {"lightning_swa.py": "lightning"}
# The first line of a warning as Python's default filter shows it: "FILE:LINE: CATEGORY: ..."
SHIMS_WARNING = re.compile(r"^(?P<file>.+):(?P<line>\d+): DetachedTensorsWarning: deepcopy_shim: ")


def not_the_shims(stderr: str) -> List[str]:
    """The lines of `stderr` that are not part of a warning of the shim.

    A warning ends with its source line, indented by two spaces, which is read from its file
    here, so a warning of the shim is known from its first line to its last."""
    lines = stderr.splitlines()
    others: List[str] = []
    index = 0
    while index < len(lines):
        first = SHIMS_WARNING.match(lines[index])
        if first is None:
            others.append(lines[index])
            index += 1
            continue
        source = Path(first["file"]).read_text(encoding="utf-8").splitlines()[int(first["line"]) - 1]
        end = lines.index(f"  {source.strip()}", index)  # ValueError: not a whole warning
        index = end + 1
    return others


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs_and_says_only_what_the_shim_says(script: Path) -> None:
    needed = NEEDS.get(script.name)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{script.name} needs {needed} (pip install '.[examples]')")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DEEPCOPY_SHIM") and k != "PYTHONWARNINGS"}  # as a user runs it
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not_the_shims(result.stderr) == [], result.stderr


def test_only_the_shims_warnings_are_taken_out() -> None:
    here = str(EXAMPLES[0])
    source = EXAMPLES[0].read_text(encoding="utf-8").splitlines()[0]
    shims = (f"{here}:1: DetachedTensorsWarning: deepcopy_shim: deep copy of a Net detached ...\n"
             "  cache['hidden']: grad_fn=ReluBackward0\nEach copy is a leaf\n"
             f"  {source.strip()}\n")
    others = [f"{here}:1: FutureWarning: deprecated", f"  {source.strip()}", "GPU available: False"]
    assert not_the_shims(shims) == []
    assert not_the_shims(shims + "\n".join(others)) == others
