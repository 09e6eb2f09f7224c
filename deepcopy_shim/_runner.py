"""The command line: run a program with the shim on, or check the installation.

`python -m deepcopy_shim` and the `deepcopy-shim` console script both call `main()`; each
speaks as the command it was invoked by.
"""

from __future__ import annotations

import os
import runpy
import sys
from types import TracebackType
from typing import Any, List, NamedTuple, Optional, Sequence, Type

from ._bootstrap import ENV_VAR, environment_setting, reported_at_startup
from ._modes import Mode, ModeSetting, ModeValueError, Source, on_and_off_words, parse_mode

__all__ = ["help_text", "invoked_as", "main", "run"]

_ON, _OFF = on_and_off_words()
_MODULE_COMMAND = "python -m deepcopy_shim"
_SCRIPT_COMMAND = "deepcopy-shim"
_HELP = f"""\
usage: {{prog}} [--mode MODE] script.py [args ...]
       {{prog}} [--mode MODE] -m package.module [args ...]
       {{prog}} --check | --version | --help
       ({{other}} is the same command)

Run a Python program with deepcopy-shim enabled, without changing a line of it: copy.deepcopy
(and everything built on it: AveragedModel, nn.Transformer, EMA callbacks, quantization with
inplace=False) copies tensors with autograd history as detached leaves instead of raising
"Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol".

The program runs as __main__ and sees exactly its own sys.argv (script.py or the module's file,
then its arguments); its exit code and exceptions pass through unchanged, and the traceback of
one it does not handle starts at its own code, as python's does.  torch is not imported by the
runner: the patch is applied when the program imports torch.

options (only before the script or -m; everything after belongs to the program):
  --mode MODE     warn (default), strict or silent:
                    warn    copy them detached; one DetachedTensorsWarning per copy
                    strict  refuse the copy where torch refuses it, with NonLeafTensorError
                            naming every such tensor the copy would meet
                    silent  copy them detached without a word
                  also {_ON} (warn) and {_OFF} (run with the shim off).
                  Without --mode, a mode named by {ENV_VAR} is kept; otherwise warn.
  -m MODULE       run a module as `python -m MODULE` would (the rest are its arguments)
  --              end of runner options (for a script whose name starts with '-')
  --check         print versions, installation and a live self-test, for bug reports;
                  exit status 1 if something is wrong (takes no --mode and no arguments)
  --version       print the version and exit
  -h, --help      show this help and exit

child processes: the runner sets {ENV_VAR}=MODE in the environment, so every Python child of the
program (multiprocessing with spawn or forkserver, DataLoader workers, torchrun ranks,
subprocess) is activated at start-up as well, through the deepcopy_shim.pth file installed with
the package.  The same variable works without the runner:
  {ENV_VAR}=warn python train.py

precedence: code in the program wins (deepcopy_shim.enable()/disable()/enabled() override the
runner and the environment).

the API, installed with the package: python -m pydoc deepcopy_shim
"""


def invoked_as(argv0: str) -> str:
    """The command a user typed to run the runner, read from `sys.argv[0]`: `python -m
    deepcopy_shim` for the package's `__main__.py` (what `-m` puts there), else the script's
    own name (`deepcopy-shim`, or whatever a wrapper calls it)."""
    if os.path.basename(argv0) == "__main__.py":
        return f"python -m {os.path.basename(os.path.dirname(os.path.abspath(argv0)))}"
    return os.path.basename(argv0) or _SCRIPT_COMMAND


def help_text(prog: str) -> str:
    """What `--help` prints, its usage lines spelled as `prog`, the command typed."""
    other = _SCRIPT_COMMAND if prog == _MODULE_COMMAND else _MODULE_COMMAND
    return _HELP.format(prog=prog, other=other)


def _usage(prog: str) -> str:
    return f"usage: {prog} [--mode MODE] (script.py | -m package.module) [args ...]; see --help"


_NEEDS_A_VALUE = "--mode needs a value: warn, strict or silent"

_ACTIONS = {"-h": "help", "--help": "help", "--check": "check", "--version": "version"}


class _UsageError(Exception):
    pass


class _Command(NamedTuple):
    action: str  # "run", "check", "version" or "help"
    mode: Optional[str]  # --mode as written, None if not given
    is_module: bool
    target: str
    args: List[str]


def _parse(argv: Sequence[str]) -> _Command:
    """Split `argv` into a command; raises _UsageError."""
    mode: Optional[str] = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _ACTIONS:
            if _ACTIONS[arg] == "check":  # help and version, as everywhere, ignore the rest
                _check_alone(mode, argv[i + 1:])
            return _Command(_ACTIONS[arg], mode, False, "", [])
        if arg == "--mode" or arg.startswith("--mode="):
            if arg == "--mode":
                if i + 1 >= len(argv):
                    raise _UsageError(_NEEDS_A_VALUE)
                mode = argv[i + 1]
                if _value_left_out(mode):
                    raise _UsageError(f"{_NEEDS_A_VALUE}; {mode!r} is not one")
                i += 2
            else:
                mode = arg.split("=", 1)[1]
                i += 1
            continue
        if arg == "-m":
            if i + 1 >= len(argv):
                raise _UsageError("-m needs a module name")
            return _Command("run", mode, True, argv[i + 1], list(argv[i + 2:]))
        if arg.startswith("-m") and len(arg) > 2:  # `-mpkg.mod`, as python itself accepts
            return _Command("run", mode, True, arg[2:], list(argv[i + 1:]))
        if arg == "--":
            i += 1
            if i >= len(argv):
                break
            return _Command("run", mode, False, argv[i], list(argv[i + 1:]))
        if arg.startswith("-") and arg != "-":
            raise _UsageError(f"unknown option {arg!r} (runner options go before the script)")
        return _Command("run", mode, False, arg, list(argv[i + 1:]))
    raise _UsageError("no program given: pass script.py or -m package.module")


def _value_left_out(word: str) -> bool:
    """True if `word`, read as the value of `--mode MODE`, is what follows a value left out:
    not a mode, and an option or the program (a `.py` name, or a path that exists)."""
    try:
        parse_mode(word, "--mode value")
    except ModeValueError:
        return word.startswith("-") or word.endswith(".py") or os.path.exists(word)
    return False


def _check_alone(mode: Optional[str], rest: Sequence[str]) -> None:
    """Refuse what `--check` would otherwise ignore; raises _UsageError."""
    if mode is not None:
        raise _UsageError("--check takes no --mode: it self-tests every mode, and reports "
                          f"{ENV_VAR} as it is")
    if rest:
        raise _UsageError(f"--check takes no arguments, got {' '.join(rest)!r}")


def _choose_setting(explicit: Optional[str]) -> Optional[ModeSetting]:
    """The setting to run with: --mode, else a mode named by DEEPCOPY_SHIM, else warn.

    Raises _UsageError for a bad or empty --mode, and for a bad DEEPCOPY_SHIM without --mode (the
    runner cannot guess what was meant, and must not run in a mode it was not asked for).
    """
    if explicit is not None:
        if not explicit.strip():  # `--mode=$MODE` with MODE unset: not a request for off
            raise _UsageError(_NEEDS_A_VALUE)
        try:
            mode = parse_mode(explicit, "--mode value")
        except ModeValueError as exc:
            raise _UsageError(str(exc).replace("deepcopy_shim: ", "", 1)) from None
        return None if mode is None else _from_runner(mode, f"--mode {explicit}")
    value = os.environ.get(ENV_VAR, "")
    try:
        from_environment = environment_setting(value)
    except ModeValueError as exc:
        if reported_at_startup(value):  # the line above this one said what is wrong with it
            raise _UsageError(f"the program was not run: fix or unset {ENV_VAR}, or pass "
                              "--mode MODE, which overrides it") from None
        said = str(exc).replace("deepcopy_shim: ", "", 1)
        raise _UsageError(f"{said}; fix or unset it, or pass --mode MODE, which overrides it") from None
    # An off value in the environment does not stop the runner: running it is the request.
    return from_environment or _from_runner(Mode.WARN, "--mode warn (the runner's default)")


def _from_runner(mode: Mode, how: str) -> ModeSetting:
    return ModeSetting(mode, Source.RUNNER, how, "--mode {}")


def run(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Do what the command line says; return the exit status for the runner's own actions.

    `argv` defaults to `sys.argv[1:]`; `prog`, the command the help and usage lines name, to
    the one `sys.argv[0]` says was typed (see `invoked_as`).  For `--help`, `--version` and
    `--check` the status is the command's; for a usage error, 2 (with the reason on stderr).
    When a program runs, its `SystemExit` and every other exception it raises propagate
    unchanged, and 0 is returned when it returns.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    prog = invoked_as(sys.argv[0] if sys.argv else "") if prog is None else prog
    try:
        command = _parse(args)
        if command.action == "help":
            sys.stdout.write(help_text(prog))
            return 0
        if command.action == "version":
            from . import __version__

            sys.stdout.write(f"deepcopy-shim {__version__}\n")
            return 0
        if command.action == "check":
            from ._doctor import check

            return check()
        setting = _choose_setting(command.mode)
        if not command.is_module and not os.path.exists(command.target):
            raise _UsageError(f"can't open file {command.target!r}: no such file")
    except _UsageError as exc:
        sys.stderr.write(f"deepcopy_shim: {exc}\n{_usage(prog)}\n")
        return 2

    # The environment first, so that children started at any point inherit the activation;
    # then this process, in case the start-up hook did not run (variable unset, `python -S`).
    os.environ[ENV_VAR] = setting.mode.value if setting is not None else "off"
    from ._activation import set_global

    set_global(setting)

    try:
        if command.is_module:
            # As `python -m`: the current directory first on sys.path (a console script would
            # otherwise have its bin/ directory there).
            sys.path[0] = os.getcwd()
            sys.argv = [command.target, *command.args]  # run_module replaces argv[0] with the path
            runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        else:
            # As `python script.py`: the script's directory first on sys.path.
            sys.path[0] = os.path.dirname(os.path.abspath(command.target))
            sys.argv = [command.target, *command.args]
            runpy.run_path(command.target, run_name="__main__")
    except ImportError as exc:
        if not _raised_by_runpy(exc.__traceback__):
            raise  # the program's own: unchanged
        # runpy's own "No module named ..." / "can't find '__main__' module in ...", raised
        # before any of the program runs: one line and status 1, as `python -m` and `python
        # DIR` say it.
        sys.stderr.write(f"deepcopy_shim: {exc}\n")
        return 1
    return 0


def _raised_by_runpy(tb: Any) -> bool:
    """True if the innermost frame of `tb` is runpy's own: it could not find what to run
    (run_module and run_path raise a plain ImportError for that, as a program may too)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == _RUNPY_FILE


_RUNPY_FILE = runpy.run_module.__code__.co_filename


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of `python -m deepcopy_shim` and `deepcopy-shim`: exits with `run()`'s status.

    An exception the program does not handle leaves it as from `run()`; when the interpreter
    reports it, the traceback starts at the program's own code, as `python script.py` shows it.
    """
    try:
        status = run(argv)
    except SystemExit:
        raise
    except BaseException:
        _show_the_programs_frames_only()
        raise
    if status:
        raise SystemExit(status)


def _show_the_programs_frames_only() -> None:
    """Make the next `sys.excepthook` call leave out the frames above the program's own.

    The hook is the one in place now (the program may have set its own), called with the
    exception's traceback cut where the program begins; it is put back at that call.  The
    interpreter still decides everything else (the exit status: 1, or SIGINT's for
    KeyboardInterrupt), as for `python script.py`.
    """
    shown = sys.excepthook

    def hook(kind: Type[BaseException], value: BaseException, tb: Optional[TracebackType]) -> None:
        sys.excepthook = shown
        tb = _the_programs_frames(tb)
        value.__traceback__ = tb  # what the default hook prints; `tb` alone is not enough
        shown(kind, value, tb)

    sys.excepthook = hook


def _the_programs_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """`tb` from the first frame of the program run by `run()`, None if it failed before any
    (a SyntaxError runpy met compiling it); `tb` itself if it did not pass through `run()`."""
    entry = tb
    while entry is not None and entry.tb_frame.f_code is not run.__code__:
        entry = entry.tb_next
    if entry is None or entry.tb_next is None or not _is_runpys(entry.tb_next):
        return tb  # not the program's exception: the runner's own failure, shown whole
    entry = entry.tb_next
    while entry is not None and _is_runpys(entry):
        entry = entry.tb_next
    return entry


def _is_runpys(entry: TracebackType) -> bool:
    return entry.tb_frame.f_code.co_filename == _RUNPY_FILE
