"""The pytest plugin, run in child pytest sessions so the outer session's state is untouched."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import List, Optional

from support.processes import CHILD_NET_SRC, DEV_PYTHON, PROBE_SRC, clean_env, describe, run

SESSION_TESTS = textwrap.dedent(
    """
    import os, subprocess, sys
    import pytest

    def state():
        modes = sys.modules.get("deepcopy_shim._modes")
        setting = modes.current_setting() if modes is not None else None
        return setting.mode.value if setting is not None else None

    def test_session_state():
        installed = "deepcopy_shim._patch" in sys.modules and sys.modules[
            "deepcopy_shim._patch"]._users > 0
        print("\\nSTATE", state(), os.environ.get("DEEPCOPY_SHIM"), installed,
              "torch" in sys.modules)

    def test_child_process():
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
        print("\\nCHILD", out.stdout.strip())
    """
) + f"PROBE = {PROBE_SRC!r}\n"


def pytest_run(tmp_path: Path, *args: str, ini: Optional[str] = None,
               env_value: Optional[str] = None,
               tests: str = SESSION_TESTS) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + (ini or ""))
    (tmp_path / "test_inner.py").write_text(tests)
    return run([DEV_PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-rA", *args],
               clean_env(env_value), cwd=tmp_path)


def grep(proc: subprocess.CompletedProcess[str], prefix: str) -> str:
    found = [line for line in proc.stdout.splitlines() if line.startswith(prefix)]
    assert found, describe(proc)
    return found[0]


def test_inert_by_default(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "deepcopy_shim:" not in proc.stdout  # no header line
    # Nothing enabled, nothing in the environment, torch not imported.  (Loading the plugin
    # imports the deepcopy_shim package itself, as any entry point inside a package does.)
    assert grep(proc, "STATE") == "STATE None None False False"
    assert grep(proc, "CHILD") == "CHILD mode=None torch=False shim=False wrapt=False"


def test_command_line_option(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, "--deepcopy-shim=Strict")
    assert proc.returncode == 0, describe(proc)
    assert ("deepcopy_shim: active, mode strict (from pytest --deepcopy-shim=Strict)"
            in proc.stdout.splitlines())
    assert grep(proc, "STATE") == "STATE strict strict True False"  # torch left alone
    assert grep(proc, "CHILD") == "CHILD mode=strict torch=False shim=True wrapt=True"


def test_ini_and_command_line_precedence(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, ini="deepcopy_shim = silent\n")
    assert ("deepcopy_shim: active, mode silent (from `deepcopy_shim = silent` in the pytest ini file)"
            in proc.stdout)
    assert grep(proc, "STATE") == "STATE silent silent True False"
    proc = pytest_run(tmp_path, "--deepcopy-shim", "warn", ini="deepcopy_shim = silent\n")
    assert "deepcopy_shim: active, mode warn (from pytest --deepcopy-shim=warn)" in proc.stdout
    assert grep(proc, "STATE") == "STATE warn warn True False"


def test_off_value_overrides_environment(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, env_value="strict")
    assert "deepcopy_shim: active, mode strict (from DEEPCOPY_SHIM=strict)" in proc.stdout
    assert "PytestAssertRewriteWarning" not in proc.stdout + proc.stderr
    assert grep(proc, "STATE").startswith("STATE strict strict")
    proc = pytest_run(tmp_path, "--deepcopy-shim=off", env_value="strict")
    assert "deepcopy_shim: off (from pytest --deepcopy-shim=off)" in proc.stdout
    assert grep(proc, "STATE").startswith("STATE None off")  # children are told: off
    assert grep(proc, "CHILD") == "CHILD mode=None torch=False shim=False wrapt=False"


def test_bad_value_is_a_usage_error(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, "--deepcopy-shim=loud")
    assert proc.returncode == 4, describe(proc)
    assert ("deepcopy_shim: invalid --deepcopy-shim value 'loud'; valid values are warn, strict, "
            "silent") in proc.stderr
    proc = pytest_run(tmp_path, ini="deepcopy_shim = maybe\n")
    assert proc.returncode == 4 and "invalid ini value deepcopy_shim = 'maybe'" in proc.stderr
    # `--deepcopy-shim=$MODE` with MODE unset: something was left out, not a request for off
    proc = pytest_run(tmp_path, "--deepcopy-shim=", env_value="strict")
    assert proc.returncode == 4, describe(proc)
    assert "deepcopy_shim: invalid --deepcopy-shim value ''; valid values are warn" in proc.stderr


MARKER_TESTS = CHILD_NET_SRC + textwrap.dedent(
    """
    import copy, warnings
    import pytest
    import deepcopy_shim as shim_module
    from deepcopy_shim import NonLeafTensorError

    def mode():
        current = shim_module.current_mode()
        return current.mode.value if current is not None else None

    @pytest.fixture
    def copied_in_fixture():
        return copy.deepcopy(make_child_net())  # function-scoped fixtures run inside the marker too

    @pytest.mark.deepcopy_shim("strict")
    def test_marker_strict():
        assert mode() == "strict"
        with pytest.raises(NonLeafTensorError):
            copy.deepcopy(make_child_net())

    @pytest.mark.deepcopy_shim(mode="silent")
    def test_marker_keyword(copied_in_fixture):
        assert mode() == "silent" and copied_in_fixture.last_hidden.is_leaf

    @pytest.mark.deepcopy_shim
    def test_marker_default_warn():
        assert mode() == "warn"
        with pytest.warns(shim_module.DetachedTensorsWarning):
            copy.deepcopy(make_child_net())

    def test_unmarked_tests_get_no_fixture_of_the_plugin(request):
        assert not [name for name in request.fixturenames if "deepcopy_shim" in name]

    @pytest.mark.deepcopy_shim("silent")
    def test_marked_tests_get_it_at_collection(request):
        assert "_deepcopy_shim_marker" in request.fixturenames

    def test_unmarked_is_native():
        assert mode() is None
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(make_child_net())

    def test_fixture(deepcopy_shim):
        assert deepcopy_shim is shim_module and mode() == "warn"

    @pytest.mark.deepcopy_shim("silent")
    def test_fixture_with_marker(deepcopy_shim):
        assert mode() == "silent"

    @pytest.mark.parametrize("deepcopy_shim", ["strict", "silent"], indirect=True)
    def test_fixture_indirect(deepcopy_shim, request):
        assert mode() == request.node.callspec.params["deepcopy_shim"]

    class TestClassMarker:
        pytestmark = pytest.mark.deepcopy_shim("silent")

        def test_in_class(self):
            assert mode() == "silent"

    def test_still_native_at_the_end():
        assert mode() is None and not (shim_module._patch.state() == "installed")
    """
)


def test_marker_and_fixture(tmp_path: Path) -> None:
    proc = pytest_run(tmp_path, "--strict-markers", tests=MARKER_TESTS)
    assert proc.returncode == 0, describe(proc)
    assert " 12 passed" in proc.stdout, describe(proc)


def test_marker_with_bad_mode_is_one_usage_line_naming_the_test(tmp_path: Path) -> None:
    """As a bad --deepcopy-shim value: pytest's one ERROR line and status 4 (usage error), at
    collection, naming the test and the marker; no code of the plugin, and no test runs."""
    tests = ("import pytest\n@pytest.mark.deepcopy_shim('loud')\ndef test_x():\n    pass\n"
             "def test_y():\n    print('RAN')\n"
             "@pytest.mark.deepcopy_shim('warn', 'strict')\ndef test_z():\n    pass\n")
    proc = pytest_run(tmp_path, tests=tests)
    assert proc.returncode == 4, describe(proc)
    (said,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert said.startswith("ERROR: deepcopy_shim: invalid mode 'loud'; valid values are warn, "
                           "strict, silent"), describe(proc)
    assert said.endswith("(in the deepcopy_shim marker of test_inner.py::test_x)"), said
    assert "pytest_plugin.py" not in proc.stdout + proc.stderr and "RAN" not in proc.stdout
    proc = pytest_run(tmp_path, tests=tests.replace("'loud'", "'silent'"))
    assert proc.returncode == 4, describe(proc)
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        "ERROR: deepcopy_shim: the deepcopy_shim marker of test_inner.py::test_z takes one mode, "
        "got ('warn', 'strict') {}; use @pytest.mark.deepcopy_shim('warn'|'strict'|'silent')"]


def test_fixture_with_a_bad_parameter_fails_that_test_in_words(tmp_path: Path) -> None:
    """An indirect parameter is that test's own: that test errors with the message alone."""
    tests = ("import pytest\n@pytest.mark.parametrize('deepcopy_shim', ['loud'], indirect=True)\n"
             "def test_x(deepcopy_shim):\n    pass\ndef test_y():\n    pass\n")
    proc = pytest_run(tmp_path, tests=tests)
    assert proc.returncode == 1 and "1 passed, 1 error" in proc.stdout, describe(proc)
    assert ("deepcopy_shim: invalid mode 'loud'; valid values are warn, strict, silent"
            in proc.stdout), describe(proc)
    assert "(in the deepcopy_shim fixture of test_inner.py::test_x[loud])" in proc.stdout
    assert "pytest_plugin.py" not in proc.stdout + proc.stderr
    assert "During handling" not in proc.stdout


def test_marker_is_registered_for_help(tmp_path: Path) -> None:
    proc = run([DEV_PYTHON, "-m", "pytest", "--markers"], clean_env(), cwd=tmp_path)
    assert "@pytest.mark.deepcopy_shim(mode='warn')" in proc.stdout, describe(proc)
    proc = run([DEV_PYTHON, "-m", "pytest", "--help"], clean_env(), cwd=tmp_path)
    assert "--deepcopy-shim=MODE" in proc.stdout and "deepcopy_shim (string)" in proc.stdout


FIXTURE_SAYS = textwrap.dedent(
    """
    import pytest

    def test_default(deepcopy_shim):
        setting = deepcopy_shim.current_mode()
        print("HOW", setting.how, "|", setting.spelled("silent"))

    @pytest.mark.parametrize("deepcopy_shim", ["strict"], indirect=True)
    def test_param(deepcopy_shim):
        setting = deepcopy_shim.current_mode()
        print("HOW", setting.how, "|", setting.spelled("silent"))
    """
)


def test_the_fixtures_messages_say_how_to_choose_its_mode(tmp_path: Path) -> None:
    """A warning of a test using the fixture says what set the mode and how to write another:
    the marker, which chooses the fixture's mode."""
    proc = pytest_run(tmp_path, tests=FIXTURE_SAYS)
    assert proc.returncode == 0, describe(proc)
    said = ["HOW" + line.split("HOW", 1)[1] for line in proc.stdout.splitlines() if "HOW " in line]
    assert said == [
        "HOW the deepcopy_shim fixture's default mode 'warn' | @pytest.mark.deepcopy_shim('silent')",
        "HOW the deepcopy_shim fixture's parameter 'strict' (indirect parametrization) | "
        "@pytest.mark.deepcopy_shim('silent')",
    ], describe(proc)


FIXTURE_FOLLOWS_THE_SESSION = CHILD_NET_SRC + textwrap.dedent(
    """
    import copy
    import pytest

    def test_bare_fixture(deepcopy_shim):
        setting = deepcopy_shim.current_mode()
        print("HOW", setting.mode.value, "|", setting.how, "|", setting.spelled("strict"))
        copy.deepcopy(make_child_net())  # -W error::...DetachedTensorsWarning: silent says nothing

    @pytest.mark.parametrize("deepcopy_shim", ["strict"], indirect=True)
    def test_parameter_wins(deepcopy_shim):
        print("HOW", deepcopy_shim.current_mode().mode.value)

    @pytest.mark.deepcopy_shim("warn")
    def test_marker_wins(deepcopy_shim):
        print("HOW", deepcopy_shim.current_mode().mode.value)
    """
)


def test_the_bare_fixture_follows_the_mode_the_session_was_started_with(tmp_path: Path) -> None:
    """`pytest --deepcopy-shim=silent` (or the ini key): a test that requests the fixture without
    a parameter or a marker copies in silent, not in the fixture's default warn; a parameter
    or a marker still wins, and a session that names no mode (off) leaves the default."""
    strict_warnings = ("-W", "error::deepcopy_shim.DetachedTensorsWarning")

    def said(proc: subprocess.CompletedProcess[str]) -> List[str]:
        return ["HOW" + line.split("HOW", 1)[1] for line in proc.stdout.splitlines() if "HOW " in line]

    for args, ini, how in (
            (("--deepcopy-shim=silent",), None, "pytest --deepcopy-shim=silent"),
            ((), "deepcopy_shim = Silent\n", "`deepcopy_shim = Silent` in the pytest ini file")):
        proc = pytest_run(tmp_path, *args, *strict_warnings, ini=ini, tests=FIXTURE_FOLLOWS_THE_SESSION)
        assert proc.returncode == 0 and " 3 passed" in proc.stdout, describe(proc)
        assert said(proc) == [
            f"HOW silent | the deepcopy_shim fixture, in the session's mode ({how}) | "
            "@pytest.mark.deepcopy_shim('strict')",
            "HOW strict", "HOW warn"], describe(proc)
    proc = pytest_run(tmp_path, "--deepcopy-shim=off", tests=FIXTURE_FOLLOWS_THE_SESSION)
    assert proc.returncode == 0 and " 3 passed" in proc.stdout, describe(proc)
    assert said(proc)[0].startswith("HOW warn | the deepcopy_shim fixture's default mode 'warn'")
