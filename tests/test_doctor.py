"""`python -m deepcopy_shim --check`: what a bug report needs, and a non-zero status when wrong."""

from __future__ import annotations

import platform
from typing import Tuple

import pytest
import torch
from support.processes import DEV_PYTHON, clean_env, describe, run

import deepcopy_shim
from deepcopy_shim import _doctor


def check(capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    status = _doctor.check()
    out, err = capsys.readouterr()
    return status, out, err


def test_all_good(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPCOPY_SHIM", raising=False)
    status, out, err = check(capsys)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"deepcopy-shim {deepcopy_shim.__version__}"
    assert f"  python         {platform.python_version()} (tested: 3.9-3.13)" in out
    assert f"  torch          {torch.__version__} (tested: 2.0-2.15)" in out
    assert "  DEEPCOPY_SHIM  unset (off)" in lines
    assert "  this process   mode off; patch off" in lines
    assert lines[-1] == "all good; paste this output into bug reports"
    assert "self-test      ok" in out
    assert len(lines) <= 12
    assert not deepcopy_shim.is_enabled()  # the self-test leaves nothing enabled


def test_it_reports_the_mode_in_effect_and_where_it_came_from(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPCOPY_SHIM", "Strict")
    deepcopy_shim.enable("silent")
    status, out, _ = check(capsys)
    assert status == 0
    assert "  DEEPCOPY_SHIM  'Strict': strict" in out
    assert "  this process   mode silent (from deepcopy_shim.enable('silent')); patch installed" in out


@pytest.mark.parametrize(("env", "problem"), [
    ("loud", "invalid DEEPCOPY_SHIM value 'loud'"),
])
def test_a_bad_value_is_a_problem(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                  env: str, problem: str) -> None:
    monkeypatch.setenv("DEEPCOPY_SHIM", env)
    status, out, err = check(capsys)
    assert status == 1
    assert f"  problem: {problem}" in out
    assert err.startswith(f"deepcopy_shim --check: {problem}") and err.count("\n") == 1


def test_a_missing_startup_hook_is_a_problem(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_doctor, "find_startup_hook", lambda: None)
    status, out, err = check(capsys)
    assert status == 1 and "  start-up hook  NOT INSTALLED" in out
    assert "deepcopy_shim.pth is not in this environment's site-packages" in err


def test_a_failing_self_test_is_a_problem(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    failure = "mode warn emitted [], not one DetachedTensorsWarning"
    monkeypatch.setattr(_doctor, "_self_test", lambda: [failure])
    status, out, err = check(capsys)
    assert status == 1 and "  self-test      FAILED" in out
    assert err == f"deepcopy_shim --check: {failure}\n"


def test_from_the_command_line() -> None:
    for command in ([DEV_PYTHON, "-m", "deepcopy_shim", "--check"],
                    [str(__import__("pathlib").Path(DEV_PYTHON).parent / "deepcopy-shim"), "--check"]):
        proc = run(command, clean_env("warn"))
        assert proc.returncode == 0, describe(proc)
        assert "  DEEPCOPY_SHIM  'warn': warn" in proc.stdout
        # started with the variable set: the start-up hook enabled it, the check imported torch
        assert "  this process   mode warn (from DEEPCOPY_SHIM=warn); patch installed" in proc.stdout
        assert "deepcopy_shim.pth" in proc.stdout
