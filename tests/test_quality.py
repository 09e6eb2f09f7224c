"""The project's own gates, run as tests so the README's one test command covers them:
ruff, mypy --strict, and the documentation site built with warnings as errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_tool(module: str, *args: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff() -> None:
    run_tool("ruff", "check", ".")


def test_mypy_strict() -> None:
    run_tool("mypy")


def test_docs_build_strict(tmp_path: Path) -> None:
    run_tool("mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"))
