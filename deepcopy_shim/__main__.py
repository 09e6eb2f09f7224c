"""``python -m deepcopy_shim`` / ``deepcopy-shim``: run a program with the shim switched on.

Like ``python -m cProfile`` or ``coverage run``: the program runs as ``__main__`` with exactly its
own ``sys.argv``; its exit code and exceptions pass through unchanged.  ``DEEPCOPY_SHIM`` is set in
the environment so that every child interpreter (``multiprocessing`` spawn/forkserver, DataLoader
workers, ``torchrun`` ranks, ``subprocess``) is activated too by the ``deepcopy_shim.pth`` start-up
hook.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import List, NoReturn, Optional, Sequence, Tuple

from ._bootstrap import ENV_VAR, parse_env_value
from ._modes import Mode

__all__ = ["main", "HELP"]

HELP = f"""\
usage: python -m deepcopy_shim [--mode MODE] script.py [args ...]
       python -m deepcopy_shim [--mode MODE] -m package.module [args ...]
       deepcopy-shim [--mode MODE] (script.py | -m package.module) [args ...]

Run a Python program with deepcopy-shim enabled, without changing a line of it: copy.deepcopy
(and everything built on it: AveragedModel, nn.Transformer, EMA callbacks, quantization with
inplace=False) copies tensors with autograd history as detached leaves instead of raising
"Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol".

The program runs as __main__ and sees exactly its own sys.argv (script.py or the module's file,
then its arguments); its exit code and exceptions pass through unchanged.  torch is not imported
by the runner: the patch is applied when the program imports torch.

options (only before the script or -m; everything after belongs to the program):
  --mode MODE     warn (default), strict or silent:
                    warn    copy non-leaf tensors detached, one DetachedTensorsWarning per copy
                    strict  refuse with NonLeafTensorError, naming every non-leaf tensor
                    silent  copy them detached without a word
                  Without --mode, a mode already named by ${ENV_VAR} is kept; otherwise warn.
  -m MODULE       run a module as `python -m MODULE` would (the rest are its arguments)
  --              end of runner options (for a script whose name starts with '-')
  -h, --help      show this help and exit

child processes: the runner sets {ENV_VAR}=MODE in the environment, so every Python child of the
program (multiprocessing with spawn or forkserver, DataLoader workers, torchrun ranks,
subprocess) is activated at start-up as well, through the deepcopy_shim.pth file installed with
the package.  The same variable works without the runner:
  {ENV_VAR}=warn python train.py       (also 1/true/on/yes; strict; silent; 0/false/off/no: off)

precedence: code in the program wins (deepcopy_shim.enable()/disable()/enabled() override the
runner and the environment).  See docs/activation.md.
"""


class _UsageError(Exception):
    pass


def _parse(argv: Sequence[str]) -> Tuple[Optional[Mode], bool, str, List[str]]:
    """Split ``argv`` into (mode, is_module, target, program args); raises _UsageError."""
    mode: Optional[Mode] = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            raise SystemExit(_print_help())
        if arg == "--mode" or arg.startswith("--mode="):
            if arg == "--mode":
                if i + 1 >= len(argv):
                    raise _UsageError("--mode needs a value: warn, strict or silent")
                value = argv[i + 1]
                i += 2
            else:
                value = arg.split("=", 1)[1]
                i += 1
            try:
                mode = Mode.parse(value)
            except ValueError as exc:
                raise _UsageError(str(exc).replace("deepcopy_shim: ", "", 1)) from None
            continue
        if arg == "-m":
            if i + 1 >= len(argv):
                raise _UsageError("-m needs a module name")
            return mode, True, argv[i + 1], list(argv[i + 2:])
        if arg.startswith("-m") and len(arg) > 2:  # `-mpkg.mod`, as python itself accepts
            return mode, True, arg[2:], list(argv[i + 1:])
        if arg == "--":
            i += 1
            if i >= len(argv):
                break
            return mode, False, argv[i], list(argv[i + 1:])
        if arg.startswith("-") and arg != "-":
            raise _UsageError(f"unknown option {arg!r} (runner options go before the script)")
        return mode, False, arg, list(argv[i + 1:])
    raise _UsageError("no program given: pass script.py or -m package.module")


def _print_help() -> int:
    sys.stdout.write(HELP)
    return 0


def _usage_error(message: str) -> NoReturn:
    sys.stderr.write(f"deepcopy_shim: {message}\n"
                     "usage: python -m deepcopy_shim [--mode warn|strict|silent] "
                     "(script.py | -m package.module) [args ...]; see --help\n")
    raise SystemExit(2)


def _choose_mode(explicit: Optional[Mode]) -> Mode:
    if explicit is not None:
        return explicit
    try:
        from_env = parse_env_value(os.environ.get(ENV_VAR, ""))
    except ValueError:
        from_env = None  # already reported by the start-up hook; the runner means "on"
    return from_env if from_env is not None else Mode.WARN


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the program named on the command line with the shim enabled.

    Returns when the program returns; ``SystemExit`` and every other exception the program
    raises propagate unchanged.  Exits with status 2 (``SystemExit``) on a usage error.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        explicit, is_module, target, program_args = _parse(args)
    except _UsageError as exc:
        _usage_error(str(exc))
    mode = _choose_mode(explicit)

    # The environment first, so that children started at any point inherit the activation;
    # then this process, in case the start-up hook did not run (variable unset, `python -S`).
    os.environ[ENV_VAR] = mode.value
    from ._activation import enable

    enable(mode)

    if is_module:
        # As `python -m`: the current directory first on sys.path (a console script would
        # otherwise have its bin/ directory there).
        sys.path[0] = os.getcwd()
        sys.argv = [target, *program_args]  # run_module replaces argv[0] with the file path
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        if not os.path.exists(target):
            _usage_error(f"can't open file {target!r}: no such file")
        # As `python script.py`: the script's directory first on sys.path.
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *program_args]
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
