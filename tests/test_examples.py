"""Every script in examples/ runs to completion (each asserts its own result)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))
NEEDS = {"lightning_swa.py": "lightning"}


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(script: Path) -> None:
    needed = NEEDS.get(script.name)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{script.name} needs {needed} (pip install '.[examples]')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEEPCOPY_SHIM")}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
        cwd=script.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
