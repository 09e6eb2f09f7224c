"""The runner's decisions in this process: every form of its command line, what the program
sees (its `__name__`, `sys.argv`, `sys.path[0]`, the variable its children inherit, the mode and
what set it), and what reaches the caller (statuses, runpy's one line, the program's own
exceptions unchanged).

tests/test_activation_runner.py runs the same in a child interpreter, as users do; these run
`deepcopy_shim._runner` in-process, so that a mutation run (CONTRIBUTING.md) sees them too.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

import deepcopy_shim
from deepcopy_shim import _runner

# What the program sees, written as JSON where RUNNER_PROBE says.
PROBE = """\
import json, os, sys
import deepcopy_shim
with open(os.environ["RUNNER_PROBE"], "w") as out:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
               "env": os.environ.get("DEEPCOPY_SHIM"), "mode": str(deepcopy_shim.current_mode())},
              out)
"""


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory holding scripts/prog.py, -dash.py and a module probe_pkg_{id}: the current
    directory, with sys.argv, sys.path, sys.modules' probe entries and DEEPCOPY_SHIM restored after."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "prog.py").write_text(PROBE)
    (tmp_path / "-dash.py").write_text(PROBE)
    package = tmp_path / "probe_runner_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(PROBE)
    (tmp_path / "probe_runner_mod.py").write_text(PROBE)
    (tmp_path / "q.py").write_text(PROBE)
    (tmp_path / "no_main").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["deepcopy-shim"])
    monkeypatch.setattr(sys, "path", ["/the/runners/own/bin", *sys.path])
    monkeypatch.setenv("RUNNER_PROBE", str(tmp_path / "probe.json"))
    monkeypatch.delenv("DEEPCOPY_SHIM", raising=False)
    for name in ("probe_runner_pkg", "probe_runner_pkg.__main__", "probe_runner_mod", "q"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def seen(here: Path) -> Dict[str, Any]:
    result: Dict[str, Any] = json.loads((here / "probe.json").read_text())
    return result


SCRIPT = os.path.join("scripts", "prog.py")


@pytest.mark.parametrize(("args", "argv", "mode"), [
    # runner options first; everything after the script is the program's, options included
    (["--mode", "strict", SCRIPT, "--mode", "x", "-m", "y", "--help", "--"],
     [SCRIPT, "--mode", "x", "-m", "y", "--help", "--"], "strict (from --mode strict)"),
    (["--mode=silent", SCRIPT, "a"], [SCRIPT, "a"], "silent (from --mode silent)"),
    (["--mode", "ON", SCRIPT], [SCRIPT], "warn (from --mode ON)"),
    # the last --mode wins, as with python's own options
    (["--mode", "strict", "--mode=silent", SCRIPT], [SCRIPT], "silent (from --mode silent)"),
    (["--mode=strict", "--mode", "silent", SCRIPT, "c"], [SCRIPT, "c"], "silent (from --mode silent)"),
    # a long line of options: positions past Python's small-int cache are compared by value
    (["--mode", "strict"] * 150 + ["--mode=silent", SCRIPT], [SCRIPT], "silent (from --mode silent)"),
    (["--mode", "silent"] * 150 + ["--", SCRIPT], [SCRIPT], "silent (from --mode silent)"),
    ([SCRIPT], [SCRIPT], "warn (from --mode warn (the runner's default))"),
    (["--", "-dash.py", "b"], ["-dash.py", "b"], "warn (from --mode warn (the runner's default))"),
    (["--mode", "silent", "--", SCRIPT, "--"], [SCRIPT, "--"], "silent (from --mode silent)"),
])
def test_a_script_sees_its_own_argv_its_directory_first_and_the_mode(
        here: Path, args: List[str], argv: List[str], mode: str) -> None:
    assert _runner.run(args) == 0
    got = seen(here)
    assert got["name"] == "__main__" and got["argv"] == argv
    assert got["path0"] == os.path.dirname(os.path.abspath(argv[0]))
    assert got["mode"] == mode and got["env"] == mode.split()[0]
    assert sys.argv == argv  # left as the program saw it, as python leaves it


@pytest.mark.parametrize(("args", "target", "rest"), [
    (["-m", "probe_runner_mod", "x", "--mode", "y"], "probe_runner_mod", ["x", "--mode", "y"]),
    (["-mprobe_runner_mod", "x", "y"], "probe_runner_mod", ["x", "y"]),  # as python accepts it
    (["--mode=silent", "-mprobe_runner_mod", "x"], "probe_runner_mod", ["x"]),
    (["-mq", "x", "y"], "q", ["x", "y"]),  # a one-letter module
    (["--mode", "silent", "-m", "probe_runner_pkg"], "probe_runner_pkg", []),
    (["--mode=silent", "-m", "probe_runner_mod", "x"], "probe_runner_mod", ["x"]),
    (["-m", "probe_runner_pkg", "-m", "z"], "probe_runner_pkg", ["-m", "z"]),
])
def test_a_module_runs_as_python_m_runs_it(here: Path, args: List[str], target: str,
                                           rest: List[str]) -> None:
    assert _runner.run(args) == 0
    got = seen(here)
    file = here / (f"{target}/__main__.py" if target.endswith("pkg") else f"{target}.py")
    assert got["name"] == "__main__" and got["argv"] == [str(file), *rest]
    assert got["path0"] == os.getcwd()  # the current directory, not the runner's bin/
    mode = "silent" if any(arg.endswith("silent") for arg in args) else "warn"
    assert got["env"] == mode and got["mode"].startswith(f"{mode} (from --mode ")


@pytest.mark.parametrize(("env", "args", "mode", "env_after"), [
    ("strict", [], "strict (from DEEPCOPY_SHIM=strict)", "strict"),  # kept
    (" Silent ", [], "silent (from DEEPCOPY_SHIM=Silent)", "silent"),
    ("strict", ["--mode", "silent"], "silent (from --mode silent)", "silent"),  # --mode wins
    ("off", [], "warn (from --mode warn (the runner's default))", "warn"),  # running is the request
    ("", [], "warn (from --mode warn (the runner's default))", "warn"),
    ("warn", ["--mode", "off"], "None", "off"),  # the shim off: current_mode() is None
    ("loud", ["--mode", "strict"], "strict (from --mode strict)", "strict"),  # --mode overrides it
])
def test_the_mode_comes_from_mode_else_the_environment_else_warn(
        here: Path, monkeypatch: pytest.MonkeyPatch, env: str, args: List[str], mode: str,
        env_after: str) -> None:
    monkeypatch.setenv("DEEPCOPY_SHIM", env)
    assert _runner.run([*args, SCRIPT]) == 0
    got = seen(here)
    assert got["mode"] == mode and got["env"] == env_after == os.environ["DEEPCOPY_SHIM"]
    assert deepcopy_shim.is_enabled() is (env_after != "off")


@pytest.mark.parametrize(("args", "env", "said"), [
    ([], None, "no program given: pass script.py or -m package.module"),
    (["--"], None, "no program given"),
    (["--mode", "strict"], None, "no program given"),
    (["--mode"], None, "--mode needs a value: warn, strict or silent"),
    (["--mode=silent", "--mode"], None, "--mode needs a value"),
    (["--mode", "strict"] * 150, None, "no program given"),
    (["--mode", "strict"] * 150 + ["--"], None, "no program given"),
    (["--mode", "strict"] * 150 + ["--mode"], None, "--mode needs a value"),
    (["--mode", "strict"] * 150 + ["-m"], None, "-m needs a module name"),
    (["--mode=warn=strict", SCRIPT], None, "invalid --mode value 'warn=strict'"),
    (["--mode", "deepcopy_shim: loud", SCRIPT], None, "invalid --mode value 'deepcopy_shim: loud'"),
    (["--mode", "loud", SCRIPT], None, "invalid --mode value 'loud'; valid values are warn, strict, silent"),
    (["--mode=", SCRIPT], None, "--mode needs a value: warn, strict or silent"),
    (["--mode", " ", SCRIPT], None, "--mode needs a value"),
    (["-m"], None, "-m needs a module name"),
    (["--mode", "silent", "-m"], None, "-m needs a module name"),
    (["--mode=silent", "-m"], None, "-m needs a module name"),
    (["--verbose", SCRIPT], None, "unknown option '--verbose' (runner options go before the script)"),
    (["-x"], None, "unknown option '-x'"),
    (["-"], None, "can't open file '-': no such file"),  # stdin is not run
    (["missing.py"], None, "can't open file 'missing.py': no such file"),
    (["--", "missing.py"], None, "can't open file 'missing.py'"),
    ([SCRIPT], "loud", "invalid DEEPCOPY_SHIM value 'loud'; valid values are warn, strict, silent"),
    ([SCRIPT], "strcit", "invalid DEEPCOPY_SHIM value 'strcit' (did you mean 'strict'?); valid "),
    # the value left out: what follows is taken for it, and the message says so
    (["--mode", SCRIPT], None, f"--mode needs a value: warn, strict or silent; {SCRIPT!r} is not one"),
    (["--mode", "typo.py"], None, "--mode needs a value: warn, strict or silent; 'typo.py' is not one"),
    (["--mode", "no_main"], None, "--mode needs a value: warn, strict or silent; 'no_main' is not one"),
    (["--mode", "--check"], None, "--mode needs a value: warn, strict or silent; '--check' is not one"),
    (["--mode", "-m", "probe_runner_mod"], None, "--mode needs a value: warn, strict or silent; '-m' is"),
    (["--mode", "loud"], None, "no program given"),  # neither an option nor a program
    # --check does what it says and nothing else: what it would ignore is refused
    (["--check", "extra"], None, "--check takes no arguments, got 'extra'"),
    (["--check", "--mode", "silent"], None, "--check takes no arguments, got '--mode silent'"),
    (["--mode", "silent", "--check"], None, "--check takes no --mode: it self-tests every mode, and "
                                            "reports DEEPCOPY_SHIM as it is"),
    (["--mode=silent", "--check", SCRIPT], None, "--check takes no --mode"),
])
def test_a_usage_error_is_status_2_one_line_and_the_usage_and_runs_nothing(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        args: List[str], env: Optional[str], said: str) -> None:
    if env is not None:
        monkeypatch.setenv("DEEPCOPY_SHIM", env)
    assert _runner.run(args) == 2
    out, err = capsys.readouterr()
    first, usage = err.splitlines()
    assert out == "" and first.startswith(f"deepcopy_shim: {said}"), first
    assert "deepcopy_shim: deepcopy_shim" not in first
    assert usage == ("usage: deepcopy-shim [--mode MODE] (script.py | -m package.module) "
                     "[args ...]; see --help")  # sys.argv[0] says how the runner was invoked
    assert not (here / "probe.json").exists() and not deepcopy_shim.is_enabled()
    assert os.environ.get("DEEPCOPY_SHIM") == env and sys.argv == ["deepcopy-shim"]


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--mode", "strict", "-h"], ["--help", SCRIPT]])
def test_help_is_the_whole_text_and_runs_nothing(here: Path, capsys: pytest.CaptureFixture[str],
                                                 args: List[str]) -> None:
    assert _runner.run(args) == 0
    assert capsys.readouterr() == (_runner.help_text("deepcopy-shim"), "")
    assert not (here / "probe.json").exists() and not deepcopy_shim.is_enabled()


def test_version_and_check(here: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert _runner.run(["--mode", "silent", "--version", SCRIPT]) == 0
    assert capsys.readouterr() == (f"deepcopy-shim {deepcopy_shim.__version__}\n", "")
    from deepcopy_shim import _doctor

    for status in (0, 1):
        monkeypatch.setattr(_doctor, "check", lambda status=status: status)
        assert _runner.run(["--check"]) == status
    assert not (here / "probe.json").exists() and not deepcopy_shim.is_enabled()


@pytest.mark.parametrize("args", [["-m", "no_such_module_for_the_runner"], ["-m", "json.no_such_part"],
                                  ["no_main"]])
def test_what_runpy_cannot_find_is_its_one_line_and_status_1(
        here: Path, capsys: pytest.CaptureFixture[str], args: List[str]) -> None:
    import runpy

    with pytest.raises(ImportError) as runpy_says:  # runpy's own words, in this Python's version
        if args[0] == "-m":
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(args[0], run_name="__main__")
    assert _runner.run(args) == 1
    assert capsys.readouterr() == ("", f"deepcopy_shim: {runpy_says.value}\n")


def test_the_programs_own_exceptions_arrive_unchanged(here: Path) -> None:
    (here / "imports.py").write_text("import no_such_thing_here\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_thing_here") as raised:
        _runner.run(["imports.py"])
    assert raised.value.name == "no_such_thing_here"
    (here / "plain.py").write_text("raise ImportError('the program says so')\n")
    with pytest.raises(ImportError, match="the program says so"):
        _runner.run(["plain.py"])
    (here / "exits.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(SystemExit) as exited:
        _runner.run(["exits.py"])
    assert exited.value.code == 3
    (here / "mod_fails.py").write_text("raise ImportError('from the module itself')\n")
    with pytest.raises(ImportError, match="from the module itself"):
        _runner.run(["-m", "mod_fails"])
    sys.modules.pop("mod_fails", None)


def test_main_exits_with_runs_status_and_returns_on_success(here: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert _runner.main(["--version"]) is None
    assert _runner.main([SCRIPT]) is None and seen(here)["argv"] == [SCRIPT]
    for args, status in (([], 2), (["-m", "no_such_module_for_the_runner"], 1)):
        with pytest.raises(SystemExit) as exited:
            _runner.main(args)
        assert exited.value.code == status
    capsys.readouterr()


def test_a_bad_variable_the_start_up_hook_reported_is_not_reported_again(
        here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One complaint per process: after the start-up hook's line about DEEPCOPY_SHIM=loud, the
    runner says only that it did not run the program, and how to."""
    from deepcopy_shim import _bootstrap

    monkeypatch.setenv("DEEPCOPY_SHIM", "loud")
    monkeypatch.setattr(_bootstrap, "_reported", None)
    assert _bootstrap.activate_from_environment() is None  # start-up, reading os.environ
    assert _bootstrap.reported_at_startup("loud") and not _bootstrap.reported_at_startup("Loud")
    assert _runner.run([SCRIPT]) == 2
    startup, runner, usage = capsys.readouterr().err.splitlines()
    assert startup.startswith("deepcopy_shim: invalid DEEPCOPY_SHIM value 'loud'; valid values are")
    assert runner == ("deepcopy_shim: the program was not run: fix or unset DEEPCOPY_SHIM, or pass "
                      "--mode MODE, which overrides it")
    assert usage.startswith("usage: ") and not (here / "probe.json").exists()
    # another value than the one reported, or one passed in rather than read: said in full
    monkeypatch.setenv("DEEPCOPY_SHIM", "louder")
    assert _runner.run([SCRIPT]) == 2
    assert "invalid DEEPCOPY_SHIM value 'louder'; valid values are " in capsys.readouterr().err
    monkeypatch.setattr(_bootstrap, "_reported", None)
    assert _bootstrap.activate_from_environment({"DEEPCOPY_SHIM": "loud"}) is None
    assert not _bootstrap.reported_at_startup("loud")
    capsys.readouterr()


def test_an_unhandled_exception_is_shown_from_the_programs_own_frames(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """main() lets the program's exception go on to the interpreter, whose report (the next
    sys.excepthook call) starts at the program's first frame, as `python prog.py` shows it."""
    shown: List[Any] = []

    def programs_hook(kind: Any, value: BaseException, tb: Any) -> None:
        shown.append((value, [entry.name for entry in traceback.extract_tb(tb)],
                       [entry.name for entry in traceback.extract_tb(value.__traceback__)]))

    monkeypatch.setattr(sys, "excepthook", programs_hook)
    (here / "fails.py").write_text("def inner():\n    raise LookupError('boom')\ninner()\n")
    with pytest.raises(LookupError) as raised:
        _runner.main(["fails.py"])
    assert sys.excepthook is not programs_hook  # installed for the interpreter's report
    sys.excepthook(LookupError, raised.value, raised.value.__traceback__)
    assert shown == [(raised.value, ["<module>", "inner"], ["<module>", "inner"])]
    assert sys.excepthook is programs_hook  # one report, then the hook it found is back
    # a SyntaxError runpy meets compiling the program: no frame at all, as python shows it
    (here / "syntax.py").write_text("def (\n")
    with pytest.raises(SyntaxError) as raised:
        _runner.main(["syntax.py"])
    sys.excepthook(SyntaxError, raised.value, raised.value.__traceback__)
    assert shown[-1][1:] == ([], [])
    # another exception reported first (a thread's, say) is shown whole, and the hook goes back
    with pytest.raises(LookupError) as raised:
        _runner.main(["fails.py"])
    other = ValueError("not the program's")
    sys.excepthook(ValueError, other, None)
    assert shown[-1] == (other, [], []) and sys.excepthook is programs_hook


def test_the_runners_own_failure_is_shown_whole(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepcopy_shim import _activation

    def cannot(setting: Any) -> None:
        raise RuntimeError("the patch cannot be installed")

    shown: List[List[str]] = []
    monkeypatch.setattr(sys, "excepthook",
                        lambda kind, value, tb: shown.append([e.name for e in traceback.extract_tb(tb)]))
    monkeypatch.setattr(_activation, "set_global", cannot)
    with pytest.raises(RuntimeError, match="cannot be installed") as raised:
        _runner.main([SCRIPT])
    whole = [entry.name for entry in traceback.extract_tb(raised.value.__traceback__)]
    sys.excepthook(RuntimeError, raised.value, raised.value.__traceback__)
    assert shown == [whole] and whole[-3:] == ["main", "run", "cannot"]


def test_without_arguments_run_reads_sys_argv(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["deepcopy-shim", "--mode", "silent", SCRIPT, "q"])
    assert _runner.run() == 0
    assert seen(here)["argv"] == [SCRIPT, "q"] and seen(here)["mode"] == "silent (from --mode silent)"
