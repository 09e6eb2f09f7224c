"""`python -m deepcopy_shim` / `deepcopy-shim`: the program runs as if started by python itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import pytest
from support.processes import (
    CHILD_NET_SRC,
    DEV_PYTHON,
    PROBE_SRC,
    clean_env,
    describe,
    run,
    stderr_lines,
)

from deepcopy_shim._runner import help_text

REPORT_SRC = PROBE_SRC + textwrap.dedent(
    """
    import os, sys
    print("name", __name__)
    print("argv", sys.argv)
    print("path0", sys.path[0])
    print("env", os.environ.get("DEEPCOPY_SHIM"))
    """
)


def runner(*args: object, env_value: Optional[str] = None,
           cwd: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
    """`python -m deepcopy_shim ARGS` in the test interpreter (an editable install)."""
    return run([DEV_PYTHON, "-m", "deepcopy_shim", *map(str, args)], clean_env(env_value),
               cwd=cwd)


def lines(proc: subprocess.CompletedProcess[str]) -> List[str]:
    return proc.stdout.splitlines()


@pytest.fixture
def prog(tmp_path: Path) -> Path:
    sub = tmp_path / "scripts"
    sub.mkdir()
    script = sub / "prog.py"
    script.write_text(REPORT_SRC)
    return script


def test_script_sees_its_own_argv_and_runs_as_main(prog: Path, tmp_path: Path) -> None:
    proc = runner("--mode", "strict", prog, "--mode", "x", "-m", "y", "--help", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert lines(proc) == [
        "mode=strict torch=False shim=True wrapt=True",  # torch is left to the program
        "name __main__",
        f"argv [{str(prog)!r}, '--mode', 'x', '-m', 'y', '--help']",
        f"path0 {prog.parent}",  # as `python prog.py`: the script's directory comes first
        "env strict",
    ]


def test_same_view_as_plain_python(prog: Path, tmp_path: Path) -> None:
    plain = run([DEV_PYTHON, "scripts/prog.py", "a", "b"], clean_env(), cwd=tmp_path)
    shimmed = runner("scripts/prog.py", "a", "b", cwd=tmp_path)
    assert lines(plain)[1:4] == lines(shimmed)[1:4], describe(shimmed)
    assert lines(shimmed)[4] == "env warn"


def test_module_mode(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "tool.py").write_text(REPORT_SRC + "print('spec', __spec__.name)\n")
    (pkg / "__main__.py").write_text("print('package main', __name__)\n")
    for form in (["-m", "pkg.sub.tool"], ["-mpkg.sub.tool"]):
        proc = runner("--mode=silent", *form, "arg", "-m", "z", cwd=tmp_path)
        assert proc.returncode == 0, describe(proc)
        assert lines(proc) == [
            "mode=silent torch=False shim=True wrapt=True",
            "name __main__",
            f"argv [{str(pkg / 'sub' / 'tool.py')!r}, 'arg', '-m', 'z']",
            f"path0 {tmp_path}",
            "env silent",
            "spec pkg.sub.tool",
        ]
    proc = runner("-m", "pkg", cwd=tmp_path)
    assert lines(proc) == ["package main __main__"], describe(proc)


@pytest.mark.parametrize(("code", "rc", "err"), [
    ("sys.exit(7)", 7, ""),
    ("sys.exit('bye')", 1, "bye"),
    ("raise SystemExit(0)", 0, ""),
    ("raise LookupError('boom')", 1, "LookupError: boom"),
])
def test_exit_codes_and_exceptions_pass_through(tmp_path: Path, code: str, rc: int,
                                                err: str) -> None:
    script = tmp_path / "exits.py"
    script.write_text(f"import sys\n{code}\n")
    plain = run([DEV_PYTHON, script], clean_env())
    shimmed = runner(script)
    for proc in (plain, shimmed):
        assert proc.returncode == rc, describe(proc)
        last = (proc.stderr.splitlines() or [""])[-1]
        assert last == err
    if "raise LookupError" in code:  # the traceback shows the program's own line
        assert f'File "{script}", line 2, in <module>' in shimmed.stderr


TRACEBACKS = {
    "raises": "def inner():\n    raise LookupError('boom')\ninner()\n",
    "chained": "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e\n",
    "interrupted": "def step():\n    raise KeyboardInterrupt\nstep()\n",
    "syntax": "def (\n",
    "own hook": ("import sys, traceback\n"
                 "sys.excepthook = lambda k, v, tb: print('HOOK', traceback.format_tb(tb))\n"
                 "raise LookupError('mine')\n"),
}


@pytest.mark.parametrize("program", TRACEBACKS, ids=list(TRACEBACKS))
def test_an_unhandled_exception_reads_as_plain_pythons(tmp_path: Path, program: str) -> None:
    """What `python prog.py` prints and exits with, the runner prints and exits with: no frame
    of the runner or runpy above the program's own (KeyboardInterrupt: SIGINT's status)."""
    script = tmp_path / "prog.py"
    script.write_text(TRACEBACKS[program])
    plain = run([DEV_PYTHON, "prog.py"], clean_env(), cwd=tmp_path)
    shimmed = runner("prog.py", cwd=tmp_path)
    assert plain.returncode != 0 and "runpy" not in plain.stderr, describe(plain)
    # python names the script by its absolute path, the runner (runpy) as it was written
    assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (
        plain.returncode, *(out.replace(str(script), "prog.py") for out in (plain.stdout, plain.stderr))
    ), describe(shimmed)


def test_an_unhandled_exception_of_a_module_shows_the_programs_frames(tmp_path: Path) -> None:
    """`python -m` shows two frames of runpy above the module's; the runner shows none."""
    (tmp_path / "prog.py").write_text(TRACEBACKS["raises"])
    plain = run([DEV_PYTHON, "-m", "prog"], clean_env(), cwd=tmp_path)
    shimmed = runner("-m", "prog", cwd=tmp_path)
    assert shimmed.returncode == plain.returncode == 1, describe(shimmed)
    runpys = [line for line in plain.stderr.splitlines(keepends=True) if "runpy" in line]
    assert len(runpys) == 2, describe(plain)
    assert shimmed.stderr == "".join(line for line in plain.stderr.splitlines(keepends=True)
                                     if line not in runpys), describe(shimmed)


def test_children_inherit_activation(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(
        f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {PROBE_SRC!r}], check=True)
        """
    ))
    proc = runner("--mode", "strict", script)
    assert lines(proc) == ["mode=strict torch=False shim=True wrapt=True"], describe(proc)


@pytest.mark.parametrize(("env_value", "args", "expected"), [
    ("strict", [], "strict"),                   # a mode already in the environment is kept
    ("strict", ["--mode", "silent"], "silent"),  # --mode wins over the environment
    ("off", [], "warn"),                         # the runner is itself the request to switch on
    (None, [], "warn"),
    ("silent", ["--mode", "ON"], "warn"),        # the vocabulary of every door

])
def test_mode_choice(prog: Path, env_value: Optional[str], args: List[str],
                     expected: str) -> None:
    proc = runner(*args, prog, env_value=env_value)
    assert lines(proc)[0].startswith(f"mode={expected} "), describe(proc)
    assert lines(proc)[-1] == f"env {expected}"


def test_copies_work_under_the_runner(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(CHILD_NET_SRC + "import copy\nema = copy.deepcopy(make_child_net())\n"
                      "print('leaf', ema.last_hidden.is_leaf)\n")
    proc = runner(script)
    assert proc.returncode == 0 and lines(proc) == ["leaf True"], describe(proc)
    assert "DetachedTensorsWarning" in proc.stderr
    assert "last_hidden" in proc.stderr


def test_help() -> None:
    proc = runner("--help")
    assert proc.returncode == 0 and proc.stdout == help_text("python -m deepcopy_shim")
    for words in ("--mode", "-m MODULE", "sys.argv", "exit code", "DEEPCOPY_SHIM=MODE",
                  "torchrun", "DataLoader", "warn", "strict", "silent", "precedence"):
        assert words in proc.stdout, words
    console = Path(DEV_PYTHON).parent / "deepcopy-shim"
    if console.exists():  # absent only when the tests run from a source tree without install
        proc = run([console, "-h"], clean_env())
        assert proc.returncode == 0 and proc.stdout == help_text("deepcopy-shim")


def test_each_command_speaks_as_itself_and_points_where_an_installed_user_can_go(tmp_path: Path) -> None:
    """`deepcopy-shim` names itself in its usage lines (not `python -m deepcopy_shim`, and the
    other way round), and the help points to what comes with the package, not to a file of the
    source tree."""
    console = Path(DEV_PYTHON).parent / "deepcopy-shim"
    commands = {"python -m deepcopy_shim": [DEV_PYTHON, "-m", "deepcopy_shim"]}
    if console.exists():
        commands["deepcopy-shim"] = [str(console)]
    for prog, command in commands.items():
        other = "deepcopy-shim" if prog.startswith("python") else "python -m deepcopy_shim"
        helped = run([*command, "--help"], clean_env())
        usage_lines = [line for line in helped.stdout.splitlines()[:4]]
        assert usage_lines == [f"usage: {prog} [--mode MODE] script.py [args ...]",
                               f"       {prog} [--mode MODE] -m package.module [args ...]",
                               f"       {prog} --check | --version | --help",
                               f"       ({other} is the same command)"], describe(helped)
        assert "docs/" not in helped.stdout and ".md" not in helped.stdout
        assert helped.stdout.rstrip().endswith("python -m pydoc deepcopy_shim")
        wrong = run([*command, "--verbose", "x.py"], clean_env(), cwd=tmp_path)
        assert wrong.returncode == 2 and stderr_lines(wrong)[-1] == (
            f"usage: {prog} [--mode MODE] (script.py | -m package.module) [args ...]; see --help")
    pydoc = run([DEV_PYTHON, "-m", "pydoc", "deepcopy_shim"], clean_env())
    assert pydoc.returncode == 0 and "enabled" in pydoc.stdout, describe(pydoc)


@pytest.mark.parametrize(("args", "message"), [
    ([], "no program given"),
    (["--mode"], "--mode needs a value"),
    (["--mode", "loud", "x.py"], "invalid --mode value 'loud'; valid values are warn, strict, silent"),
    (["--verbose", "x.py"], "unknown option '--verbose'"),
    (["-m"], "-m needs a module name"),
    (["does_not_exist.py"], "can't open file 'does_not_exist.py'"),
    (["--mode", "script.py"], "--mode needs a value: warn, strict or silent; 'script.py' is not one"),
    (["--mode", "--check"], "--mode needs a value: warn, strict or silent; '--check' is not one"),
    (["--check", "extra"], "--check takes no arguments, got 'extra'"),
    (["--mode", "silent", "--check"], "--check takes no --mode"),
])
def test_usage_errors(tmp_path: Path, args: List[str], message: str) -> None:
    proc = runner(*args, cwd=tmp_path)
    assert proc.returncode == 2, describe(proc)
    first, second = stderr_lines(proc)
    assert first.startswith("deepcopy_shim: ") and message in first, first
    assert second.startswith("usage: python -m deepcopy_shim") and "--help" in second  # runner() is -m
    assert proc.stdout == ""


@pytest.mark.parametrize("what", ["-m no_such_module", "-m json.no_such_part", "a directory"])
def test_what_cannot_be_found_is_one_line_and_status_1_as_python_says_it(
        tmp_path: Path, what: str) -> None:
    """As `python -m no_such_module` and `python DIR` (without __main__.py): runpy's own words
    on one line, status 1, no traceback; the program's own ImportError is another matter."""
    (tmp_path / "pkgdir").mkdir()
    args = what.split() if what.startswith("-m") else [tmp_path / "pkgdir"]
    native = run([DEV_PYTHON, *map(str, args)], clean_env(), cwd=tmp_path)
    proc = runner(*args, cwd=tmp_path)
    assert proc.returncode == native.returncode == 1, describe(proc)
    (said,) = stderr_lines(proc)
    (python_said,) = stderr_lines(native)
    assert said == "deepcopy_shim: " + python_said.split(": ", 1)[1], describe(proc)
    assert proc.stdout == ""


def test_the_programs_own_import_error_still_passes_through(tmp_path: Path) -> None:
    script = tmp_path / "imports.py"
    script.write_text("import no_such_thing_here\n")
    proc = runner(script, cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, describe(proc)
    assert "ModuleNotFoundError: No module named 'no_such_thing_here'" in proc.stderr


def test_runner_is_importable_without_side_effects() -> None:
    proc = run([DEV_PYTHON, "-c", "import deepcopy_shim.__main__, sys; "
                "print('torch' in sys.modules, sys.modules['deepcopy_shim']._modes.global_setting())"],
               clean_env())
    assert proc.stdout.strip() == "False None", describe(proc)


def test_mode_off_runs_the_program_with_the_shim_off(prog: Path) -> None:
    proc = runner("--mode", "off", prog, env_value="strict")
    assert proc.returncode == 0, describe(proc)
    assert lines(proc)[0].startswith("mode=None ") and lines(proc)[-1] == "env off"


def test_a_bad_environment_value_stops_the_runner_and_is_said_once(prog: Path) -> None:
    """The start-up hook, which speaks first, says what is wrong with the value; the runner then
    refuses to guess a mode, and says only that (and how to run it anyway)."""
    proc = runner(prog, env_value="loud")
    assert proc.returncode == 2 and proc.stdout == "", describe(proc)
    startup, runner_error, usage = stderr_lines(proc)
    assert startup.startswith("deepcopy_shim: invalid DEEPCOPY_SHIM value 'loud'; valid values are")
    assert startup.endswith("start-up activation by DEEPCOPY_SHIM skipped")
    assert runner_error == ("deepcopy_shim: the program was not run: fix or unset DEEPCOPY_SHIM, "
                            "or pass --mode MODE, which overrides it")
    assert proc.stderr.count("'loud'") == 1 and usage.startswith("usage:")
    proc = runner("--mode", "silent", prog, env_value="loud")  # --mode overrides it
    assert proc.returncode == 0 and lines(proc)[-1] == "env silent", describe(proc)


def test_version() -> None:
    import deepcopy_shim

    for command in ([DEV_PYTHON, "-m", "deepcopy_shim", "--version"],
                    [Path(DEV_PYTHON).parent / "deepcopy-shim", "--version"]):
        proc = run(command, clean_env())
        assert proc.returncode == 0 and proc.stdout == f"deepcopy-shim {deepcopy_shim.__version__}\n"


# --- the same, in this process (the runner's decisions, without a child interpreter) ---------


@pytest.mark.parametrize(("args", "status", "stream", "text"), [
    (["--version"], 0, "out", "deepcopy-shim "),
    (["-h"], 0, "out", "usage: python -m deepcopy_shim"),
    ([], 2, "err", "deepcopy_shim: no program given"),
    (["--mode"], 2, "err", "deepcopy_shim: --mode needs a value"),
    (["--mode=loud", "x.py"], 2, "err", "deepcopy_shim: invalid --mode value 'loud'"),
    (["-m"], 2, "err", "deepcopy_shim: -m needs a module name"),
    (["--", "missing.py"], 2, "err", "deepcopy_shim: can't open file 'missing.py'"),
])
def test_run_in_process(args: List[str], status: int, stream: str, text: str,
                        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                        tmp_path: Path) -> None:
    from deepcopy_shim import _runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DEEPCOPY_SHIM", raising=False)
    monkeypatch.setattr(sys, "argv", [os.path.join(os.path.dirname(_runner.__file__), "__main__.py")])
    assert _runner.run(args) == status
    out, err = capsys.readouterr()
    assert (out if stream == "out" else err).startswith(text)


def test_run_a_script_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deepcopy_shim
    from deepcopy_shim import _runner

    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    monkeypatch.setattr(sys, "argv", ["deepcopy-shim"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("DEEPCOPY_SHIM", "silent")
    assert _runner.run([str(script), "a"]) == 0
    assert str(deepcopy_shim.current_mode()) == "silent (from DEEPCOPY_SHIM=silent)"
    monkeypatch.setenv("DEEPCOPY_SHIM", "off")
    assert _runner.run(["--mode", "strict", str(script)]) == 0
    assert str(deepcopy_shim.current_mode()) == "strict (from --mode strict)"
    assert sys.argv == [str(script)] and os.environ["DEEPCOPY_SHIM"] == "strict"
