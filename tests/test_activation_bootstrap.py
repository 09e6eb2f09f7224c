"""What the start-up hook calls: parsing DEEPCOPY_SHIM and enabling, never raising."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from support.processes import DEV_PYTHON, REPO, clean_env, describe, run_code

import deepcopy_shim
from deepcopy_shim import Mode, ModeSetting, Source, _activation, _bootstrap
from deepcopy_shim._bootstrap import activate_from_environment, environment_setting
from deepcopy_shim._modes import OFF_WORDS, ON_WORDS
from deepcopy_shim._notices import print_notice


def parse_env_value(value: str) -> Optional[Mode]:
    setting = environment_setting(value)
    return None if setting is None else setting.mode

PTH = REPO / "deepcopy_shim" / "deepcopy_shim.pth"


@pytest.mark.parametrize(("value", "expected"), [
    *[(v, Mode.WARN) for v in ON_WORDS],
    *[(v, None) for v in OFF_WORDS],
    *[(m.value, m) for m in Mode],  # every mode name, from the enum itself
    ("WaRn", Mode.WARN), ("  STRICT \n", Mode.STRICT), ("\tSilent", Mode.SILENT),
    ("TRUE", Mode.WARN), (" Yes ", Mode.WARN), ("ON", Mode.WARN),
    ("FALSE", None), (" Off", None), ("NO", None),
    ("", None), ("   ", None),  # blank: the variable reads as unset
])
def test_vocabulary(value: str, expected: Optional[Mode]) -> None:
    assert parse_env_value(value) is expected


@pytest.mark.parametrize("bad", ["loud", "2", "-1", "warn strict", "y", "enabled", "on!"])
def test_bad_values_name_value_and_valid_ones(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_env_value(bad)
    message = str(info.value)
    guess = {"warn strict": " (did you mean 'strict'?)", "on!": " (did you mean 'on'?)"}.get(bad, "")
    assert message.startswith(f"deepcopy_shim: invalid DEEPCOPY_SHIM value {bad!r}{guess}; valid values are ")
    for word in ("warn", "strict", "silent", "1, true, on, yes", "0, false, off, no"):
        assert word in message


def test_activate_enables_in_the_named_mode() -> None:
    assert activate_from_environment({"DEEPCOPY_SHIM": " Strict "}) is Mode.STRICT
    setting = deepcopy_shim.current_mode()
    assert setting is not None and deepcopy_shim.is_enabled()
    assert (setting.mode, setting.source, setting.spelled()) == (
        Mode.STRICT, Source.ENVIRONMENT, "DEEPCOPY_SHIM=Strict")


def test_activate_off_and_unset_change_nothing() -> None:
    assert activate_from_environment({}) is None
    assert activate_from_environment({"DEEPCOPY_SHIM": "off"}) is None
    assert not deepcopy_shim.is_enabled()


def test_explicit_code_wins_after_activation() -> None:
    activate_from_environment({"DEEPCOPY_SHIM": "warn"})
    deepcopy_shim.enable("silent")
    assert deepcopy_shim.current_mode() == ModeSetting(
        Mode.SILENT, Source.CODE, "deepcopy_shim.enable('silent')")
    deepcopy_shim.disable()
    assert not deepcopy_shim.is_enabled()


def test_bad_value_reports_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert activate_from_environment({"DEEPCOPY_SHIM": "loud\ner"}) is None
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("deepcopy_shim: invalid DEEPCOPY_SHIM value ")
    assert err.endswith("; start-up activation by DEEPCOPY_SHIM skipped\n")
    assert not deepcopy_shim.is_enabled()


def test_failure_to_enable_reports_one_line(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def broken(setting: object) -> None:
        raise RuntimeError("deepcopy_shim: copy._deepcopy_dispatch is\nnot the dict")

    monkeypatch.setattr(_activation, "set_global", broken)
    assert activate_from_environment({"DEEPCOPY_SHIM": "warn"}) is None
    err = capsys.readouterr().err
    # decided by the exception's type, not by its words: this one is a failure, not a bad value
    assert err == ("deepcopy_shim: start-up activation by DEEPCOPY_SHIM failed (RuntimeError: "
                   "deepcopy_shim: copy._deepcopy_dispatch is not the dict); the shim stays off\n")


@pytest.mark.parametrize("missing", ["wrapt", "torch"])
def test_a_requirement_that_cannot_be_imported_says_how_to_reinstall_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], missing: str) -> None:
    def broken(setting: object) -> None:
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

    monkeypatch.setattr(_activation, "set_global", broken)
    assert activate_from_environment({"DEEPCOPY_SHIM": "warn"}) is None
    err = capsys.readouterr().err
    assert err.startswith("deepcopy_shim: start-up activation by DEEPCOPY_SHIM failed "
                          f"(ModuleNotFoundError: No module named '{missing}'); the shim stays off; "
                          f'to fix it: pip install --force-reinstall "{missing}'), err
    assert err.count("\n") == 1


def test_another_missing_module_is_not_ours_to_mend(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def broken(setting: object) -> None:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(_activation, "set_global", broken)
    activate_from_environment({"DEEPCOPY_SHIM": "warn"})
    assert capsys.readouterr().err.endswith("the shim stays off\n")


def test_print_notice_survives_missing_or_closed_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", None)
    print_notice("deepcopy_shim: x")
    closed = io.StringIO()
    closed.close()
    monkeypatch.setattr(sys, "stderr", closed)
    print_notice("deepcopy_shim: x")


# ---------------------------------------------------------------------------------------------
# The .pth line itself, executed in a fresh interpreter without site (-S) so only it runs.

def _exec_pth(value: Optional[str], extra_path: Optional[Path] = None
              ) -> subprocess.CompletedProcess[str]:
    spec = importlib.util.find_spec("wrapt")
    assert spec is not None and spec.origin is not None
    site_packages = str(Path(spec.origin).parent.parent)
    code = (
        "import os, sys\n"  # site, skipped here by -S, has imported os before any .pth runs
        + (f"sys.path.insert(0, {str(extra_path)!r})\n" if extra_path else "")
        + f"sys.path += [{str(REPO)!r}, {site_packages!r}]\n"
        # read before the snapshot: on Python 3.9 a text-mode open() imports _bootlocale
        f"line = open({str(PTH)!r}).read().splitlines()[0]\n"
        "before = set(sys.modules)\n"
        "exec(line)\n"
        "exec(line)  # venvs process .pth files twice\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    return subprocess.run([DEV_PYTHON, "-S", "-c", code], env=clean_env(value),
                          capture_output=True, text=True, timeout=60)


def test_pth_line_unset_or_off_imports_nothing() -> None:
    for value in (None, "", "  ", "0", " OFF ", "False", "no"):
        proc = _exec_pth(value)
        assert proc.stdout.strip() == "[]" and proc.stderr == "", describe(proc)


def test_pth_line_set_imports_the_package_but_not_torch() -> None:
    proc = _exec_pth("warn")
    imported = proc.stdout.strip()
    assert "'deepcopy_shim._bootstrap'" in imported and "'torch'" not in imported, describe(proc)
    assert proc.stderr == ""


def test_pth_line_reports_an_import_failure_once(tmp_path: Path) -> None:
    (tmp_path / "deepcopy_shim").mkdir()
    (tmp_path / "deepcopy_shim" / "__init__.py").write_text("1/0\n")
    proc = _exec_pth("strict", extra_path=tmp_path)
    assert proc.returncode == 0, describe(proc)
    # the wording of _bootstrap.startup_failure, which the .pth cannot import here
    assert proc.stderr == ("deepcopy_shim: start-up activation by DEEPCOPY_SHIM failed "
                           "(ZeroDivisionError: division by zero); the shim stays off\n")
    assert proc.stderr == _bootstrap.startup_failure(
        ZeroDivisionError("division by zero"), "start-up activation by DEEPCOPY_SHIM") + "\n"


def test_pth_is_one_ascii_line() -> None:
    text = PTH.read_bytes()
    text.decode("ascii")  # PEP 829: .pth files must be UTF-8 from 3.20; ASCII is both
    assert text.count(b"\n") == 1 and text.endswith(b"\n")
    assert text.startswith(b"import ")  # site executes only lines that start with "import"


def test_pth_gate_uses_the_same_off_values() -> None:
    # The .pth repeats the "off" words so that DEEPCOPY_SHIM=0 costs nothing at start-up either;
    # they must stay those of _bootstrap, with blank (the variable set to nothing) for unset.
    match = re.search(r"\.strip\(\)\.lower\(\) not in (\([^)]*\))", PTH.read_text())
    assert match is not None
    assert set(ast.literal_eval(match.group(1))) == {*OFF_WORDS, ""}


def test_bootstrap_shares_the_mode_vocabulary() -> None:
    assert {m.value for m in Mode} <= {"warn", "strict", "silent"}
    assert not set(ON_WORDS) & set(OFF_WORDS)
    assert not {m.value for m in Mode} & (set(ON_WORDS) | set(OFF_WORDS))
    assert _bootstrap.ENV_VAR == "DEEPCOPY_SHIM"


# ---------------------------------------------------------------------------------------------
# PEP 829 (Python 3.15): `import` lines in .pth files keep running through 3.17 *unless* a
# matching `<name>.start` file exists, and are ignored from 3.18 on.  We ship only the .pth for
# now (a .start entry point would import the package, ~50 ms, at every start-up even with the
# variable unset).  The plan is in CONTRIBUTING.md; this test fails on the first Python that
# stops executing import lines, which is when the plan must be carried out.

def test_pep_829_import_lines_still_run(tmp_path: Path) -> None:
    assert not (REPO / "deepcopy_shim" / "deepcopy_shim.start").exists(), (
        "a deepcopy_shim.start beside deepcopy_shim.pth disables the .pth's import line on "
        "Python >= 3.15: it must then carry the activation itself (see CONTRIBUTING.md)")
    (tmp_path / "probe_import_lines.pth").write_text(
        "import sys; sys.stdout.write('import lines run\\n')\n")
    code = f"import site; site.addsitedir({str(tmp_path)!r})"
    proc = run_code(DEV_PYTHON, code, clean_env())
    assert proc.stdout == "import lines run\n", (
        f"Python {sys.version_info[:2]} no longer executes import lines in .pth files (PEP 829): "
        "DEEPCOPY_SHIM activation is dead on this Python. Ship deepcopy_shim.start with "
        "`_deepcopy_shim_start:activate` as CONTRIBUTING.md plans.\n" + describe(proc))
