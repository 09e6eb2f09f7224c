"""CI's last lines say why each tox environment failed (.ci/tox_summary.py).

CI shows only the end of its output, so the summary must carry the reason itself: a set-up that
failed names pip's error and the disk space left, a run names pytest's counts.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Tuple

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / ".ci" / "tox_summary.py"


@pytest.fixture(scope="module")
def summary() -> ModuleType:
    if not SCRIPT.exists():
        pytest.skip(".ci/ is not beside these tests (an installed sdist)")
    spec = importlib.util.spec_from_file_location("tox_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(summary: ModuleType, tmp_path: Path, envs: Dict[str, Any], capsys: Any) -> Tuple[int, List[str]]:
    result = tmp_path / "ci-result.json"
    result.write_text(json.dumps({"testenvs": envs}))
    status = summary.main([str(result), *envs, "never-made"])
    return status, capsys.readouterr().out.splitlines()


def test_a_failed_set_up_names_pips_error_and_the_free_disk(
    summary: ModuleType, tmp_path: Path, capsys: Any
) -> None:
    pip_failed = {
        "setup": [
            {"run_id": "install_package_deps", "retcode": 0, "err": ""},
            {
                "run_id": "install_deps",
                "retcode": 1,
                "err": "Collecting torch==2.15.*\nERROR: Could not install packages due to an "
                "OSError: [Errno 28] No space left on device\n\n",
            },
        ]
    }
    passed = {
        "installed_packages": ["torch==2.13.0", "wrapt==2.5.2"],
        "python": {"version_info": [3, 11, 7]},
        "test": [{"retcode": 0, "output": "===== 3 passed, 1 skipped in 1.20s =====\n"}],
    }
    nothing_collected = {"test": [{"retcode": 5, "output": "===== no tests ran in 0.01s =====\n"}]}
    status, lines = _run(
        summary,
        tmp_path,
        {"full": pip_failed, "ok": passed, "empty": nothing_collected},
        capsys,
    )
    assert status == 1
    assert re.fullmatch(
        r"FAIL full: did not run its tests \(install_deps failed: ERROR: Could not install "
        r"packages due to an OSError: \[Errno 28\] No space left on device; "
        r"\d+\.\d GiB free on its disk\)",
        lines[0],
    ), lines[0]
    assert lines[1] == "PASS ok (torch 2.13.0, wrapt 2.5.2, Python 3.11.7): 3 passed, 1 skipped in 1.20s"
    assert lines[2] == "FAIL empty (torch ?, wrapt ?, Python ?): no tests ran in 0.01s"
    assert re.fullmatch(
        r"FAIL never-made: did not run its tests \(not set up; \d+\.\d GiB free on its disk\)",
        lines[3],
    )
    assert lines[4] == "tox: 1 of 4 environments passed"


def test_all_passed_is_status_zero(summary: ModuleType, tmp_path: Path, capsys: Any) -> None:
    result = tmp_path / "ci-result.json"
    ok = {"test": [{"retcode": 0, "output": "== 1 passed in 0.1s ==\n"}]}
    result.write_text(json.dumps({"testenvs": {"a": ok}}))
    assert summary.main([str(result), "a"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "tox: 1 of 1 environments passed"


def test_pips_cause_is_named_not_its_hint_and_a_failed_package_build_is_named(
    summary: ModuleType, tmp_path: Path, capsys: Any
) -> None:
    conflict = {
        "setup": [
            {
                "run_id": "install_deps",
                "retcode": 1,
                "err": "ERROR: Cannot install alpha==1.0 and beta==2.0 because these package "
                "versions have conflicting dependencies.\n\nThe conflict is caused by: ...\n\n"
                "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/\n",
            }
        ]
    }
    # tox records a failed build of the package under .pkg, without an exit status.
    package = {
        "setup": [
            {"run_id": "_optional_hooks", "retcode": None, "err": ""},
            {
                "run_id": "get_requires_for_build_wheel",
                "retcode": None,
                "err": 'Traceback (most recent call last):\n  File "backend.py", line 2\n'
                "RuntimeError: the build backend failed\n",
            },
        ]
    }
    result = tmp_path / "ci-result.json"
    result.write_text(json.dumps({"testenvs": {"conflict": conflict, "a": {}, ".pkg": package}}))
    assert summary.main([str(result), "conflict", "a"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        "FAIL conflict: did not run its tests (install_deps failed: ERROR: Cannot install alpha==1.0"
    ), lines[0]
    assert lines[1].startswith(
        "FAIL a: did not run its tests (its package build failed: RuntimeError: the build backend failed; "
    ), lines[1]

