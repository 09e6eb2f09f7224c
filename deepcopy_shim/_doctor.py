"""`python -m deepcopy_shim --check`: what a bug report needs, in a few lines.

Versions and the tested ranges, the platform and the GPUs torch sees, the start-up hook,
`DEEPCOPY_SHIM` and what it resolves to, the state of the patch in this process, and a live
self-test of every mode on a real non-leaf tensor, copied and sent to another process (as
multiprocessing pickles it).  Exit status 1 when something is wrong: each problem is one
`problem:` line of the report, and the first is also the one line on stderr.
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from typing import Any, List, Optional, Tuple

from . import __version__, _patch
from ._bootstrap import ENV_VAR, environment_setting, reported_at_startup
from ._modes import ModeValueError
from ._sites import site_packages_dirs
from ._tested import (
    TESTED_PYTHON,
    TESTED_TORCH,
    TESTED_WRAPT,
    excluded_versions,
    minor_of,
    reinstall_command,
    tested_range_text,
)

__all__ = ["check", "find_startup_hook"]

_HOOK = "deepcopy_shim.pth"


def find_startup_hook() -> Optional[str]:
    """The path of the `deepcopy_shim.pth` that this interpreter reads at start-up, or None."""
    for directory in site_packages_dirs():
        path = os.path.join(directory, _HOOK)
        if os.path.isfile(path):
            return path
    return None


def _range_note(version: str, tested: Tuple[Tuple[int, int], Tuple[int, int]]) -> str:
    minor = minor_of(version)
    span = tested_range_text(tested)
    if minor is None:
        return f"unreadable version; tested: {span}"
    if minor < tested[0]:
        return f"OLDER than the tested {span}: not supported"
    if minor > tested[1]:
        return f"newer than the tested {span}: untested, the self-test below decides"
    return f"tested: {span}"


def _platform_line() -> str:
    """`Linux 6.8.0-45-generic x86_64, glibc 2.35`: what the OS and the C library are."""
    text = " ".join(part for part in (platform.system(), platform.release(), platform.machine()) if part)
    try:
        libc, version = platform.libc_ver()
    except (OSError, ValueError):  # it may read sys.executable's binary
        libc, version = "", ""
    if libc:
        text += f", {libc} {version}".rstrip()
    elif platform.system() == "Linux":
        text += ", libc unknown"  # musl, or a static interpreter
    return text or "unknown"


def _device_names(cuda: Any, count: int) -> str:
    """`NVIDIA H200 x2, Tesla T4`: names in device order, repeats counted."""
    names: List[str] = []
    for index in range(count):
        try:
            names.append(str(cuda.get_device_name(index)))
        except Exception as exc:  # a device that cannot be queried is still a device
            names.append(f"device {index} unreadable ({type(exc).__name__})")
    seen = {name: names.count(name) for name in names}  # insertion order: first appearance
    return ", ".join(name if times == 1 else f"{name} x{times}" for name, times in seen.items())


def _gpu_line(torch: Any) -> str:
    """What torch was built for (CUDA, ROCm/HIP, MPS) and the devices it sees; never raises.

    A build without CUDA is answered without touching a driver; otherwise torch's own queries
    run with their warnings ("Found no NVIDIA driver") silenced: no driver means no CUDA here,
    not a problem.
    """
    version = getattr(torch, "version", None)
    hip, cuda = getattr(version, "hip", None), getattr(version, "cuda", None)
    built = f"ROCm/HIP {hip}" if hip else f"CUDA {cuda}" if cuda else None
    parts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if built is None:
            parts.append("no CUDA (torch built without CUDA)")
        else:
            try:
                count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            except Exception as exc:
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
                parts.append(f"no CUDA: torch built with {built}, its device query failed ({reason})")
            else:
                if count:
                    devices = "1 device" if count == 1 else f"{count} devices"
                    parts.append(f"{built}, {devices}: {_device_names(torch.cuda, count)}")
                else:
                    parts.append(f"no CUDA: torch built with {built}, no device visible "
                                 "(no driver or no GPU)")
        try:
            mps = torch.backends.mps
            if mps.is_built():
                parts.append("MPS available" if mps.is_available() else "MPS built, not available")
        except Exception:  # a torch without torch.backends.mps: nothing to say
            pass
    return "; ".join(parts)


def _self_test() -> List[str]:
    """Problems found copying a real non-leaf tensor in every mode ([] when all is well), in
    neutral torch state (the same answer under the caller's no_grad, modes and defaults)."""
    import copy

    import torch

    from ._activation import enabled
    from ._errors import DetachedTensorsWarning, NonLeafTensorError
    from ._tensor import REFUSAL, neutral_torch

    problems = []
    with neutral_torch():
        source = torch.ones(2, requires_grad=True, device="cpu", dtype=torch.float32) * 3
        with enabled("off"):
            try:
                copy.deepcopy(source)
                problems.append("torch copies non-leaf tensors itself: the shim is not needed here")
            except RuntimeError as exc:
                if REFUSAL not in str(exc):
                    problems.append(f"torch refuses non-leaf tensors with an unknown message: {exc}")
        with enabled("silent"):
            made = copy.deepcopy(source)
            if not (made.is_leaf and made.requires_grad and torch.equal(made, source)
                    and made.data_ptr() != source.data_ptr()):
                problems.append("mode silent did not make a detached leaf copy with equal values")
        with enabled("warn"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            copy.deepcopy(source)
        if [w.category for w in caught] != [DetachedTensorsWarning]:
            problems.append(f"mode warn emitted {[w.category.__name__ for w in caught]}, "
                            "not one DetachedTensorsWarning")
        with enabled("strict"):
            try:
                copy.deepcopy(source)
                problems.append("mode strict copied a non-leaf tensor instead of refusing it")
            except NonLeafTensorError as exc:
                if exc.paths != ("",):
                    problems.append(f"mode strict named {exc.paths!r}, not the copied tensor itself")
        problems += _send_self_test(source)
    return problems


def _send_self_test(source: Any) -> List[str]:
    """Problems found sending the non-leaf tensor `source` to another process in every mode, as
    multiprocessing pickles it ([] when all is well); what is sent is loaded back here, as a
    receiver loads it."""
    from multiprocessing.reduction import ForkingPickler

    import torch

    from ._activation import enabled
    from ._errors import DetachedTensorsWarning, NonLeafTensorError

    problems = []
    with enabled("off"):
        try:
            ForkingPickler.dumps(source)
            problems.append("torch's multiprocessing sends non-leaf tensors itself")
        except RuntimeError as exc:
            if type(exc) is not RuntimeError or "non-leaf" not in str(exc):
                problems.append(f"torch's multiprocessing refuses non-leaf tensors in unknown words: {exc}")
    with enabled("silent"):
        made = ForkingPickler.loads(ForkingPickler.dumps(source))
    if not (made.is_leaf and made.requires_grad and torch.equal(made, source)
            and made.data_ptr() != source.data_ptr()):
        problems.append("mode silent did not send a detached leaf copy with equal values")
    with enabled("warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ForkingPickler.dumps(source)
    if [w.category for w in caught] != [DetachedTensorsWarning]:
        problems.append(f"mode warn emitted {[w.category.__name__ for w in caught]} on a send, "
                        "not one DetachedTensorsWarning")
    with enabled("strict"):
        try:
            ForkingPickler.dumps(source)
            problems.append("mode strict sent a non-leaf tensor instead of refusing it")
        except NonLeafTensorError as exc:
            if exc.paths != ("",) or type(exc.__cause__) is not RuntimeError:
                problems.append(f"mode strict named {exc.paths!r} and gave {exc.__cause__!r} as the cause "
                                "of its refusal to send, not the tensor itself and torch's error")
    return problems


def check() -> int:
    """Print the report; return 0 if all is well, else 1 (after one line on stderr saying what:
    the first problem, or none where the start-up hook has already said on stderr that
    `DEEPCOPY_SHIM` is invalid, which is then the one line)."""
    problems: List[str] = []
    lines = [f"deepcopy-shim {__version__}"]
    python = platform.python_version()
    lines.append(f"  python         {python} ({_range_note(python, TESTED_PYTHON)})  {sys.executable}")
    lines.append(f"  platform       {_platform_line()}")
    wrapt_ok = False
    try:
        import wrapt
    except Exception as exc:  # not only ImportError: a broken install raises anything
        lines.append("  wrapt          CANNOT BE IMPORTED")
        problems.append(f"wrapt cannot be imported ({type(exc).__name__}: {exc}): "
                        f"{reinstall_command('wrapt')}")
    else:
        wrapt_version = str(getattr(wrapt, "__version__", "?"))
        excluded = wrapt_version in excluded_versions("wrapt")
        note = "EXCLUDED by deepcopy-shim's requirements" if excluded else _range_note(
            wrapt_version, TESTED_WRAPT)
        lines.append(f"  wrapt          {wrapt_version} ({note})")
        if excluded:
            problems.append(f"wrapt {wrapt_version} is excluded by deepcopy-shim's requirements "
                            f"(a known regression): {reinstall_command('wrapt')}")
        wrapt_ok = True
    hook = find_startup_hook()
    lines.append(f"  start-up hook  {hook or 'NOT INSTALLED'}")
    if hook is None:
        problems.append(f"{_HOOK} is not in this environment's site-packages, so {ENV_VAR} does "
                        "nothing at start-up: install the package with pip (not by copying files)")
    value = os.environ.get(ENV_VAR)
    said_at_startup = False
    if value is None:
        lines.append(f"  {ENV_VAR}  unset (off)")
    else:
        try:
            setting = environment_setting(value)
            lines.append(f"  {ENV_VAR}  {value!r}: {setting.mode.value if setting else 'off'}")
        except ModeValueError as exc:
            lines.append(f"  {ENV_VAR}  {value!r}: INVALID")
            problems.append(str(exc).replace("deepcopy_shim: ", "", 1))
            said_at_startup = reported_at_startup(value)
    try:
        import torch
    except Exception as exc:
        problems.append(f"torch cannot be imported ({type(exc).__name__}: {exc})")
    else:
        from ._activation import current_mode

        setting_now = current_mode()
        lines.append(f"  torch          {torch.__version__} ({_range_note(torch.__version__, TESTED_TORCH)})")
        lines.append(f"  gpu            {_gpu_line(torch)}")
        lines.append(f"  this process   mode {setting_now or 'off'}; patch {_patch.state()}")
        if _patch.inert_reason():
            problems.append(str(_patch.inert_reason()))
        if not wrapt_ok:
            lines.append("  self-test      skipped (the patch needs wrapt)")
        elif _patch.inert_reason():
            lines.append("  self-test      skipped (the shim stays out of the way, see below)")
        else:
            try:
                test = _self_test()
            except Exception as exc:  # the patch could not even be installed: say why, once
                test = [" ".join(str(exc).replace("deepcopy_shim: ", "", 1).split())]
            lines.append(f"  self-test      {'FAILED' if test else 'ok'} (native refusal; silent, "
                         "warn and strict on a real non-leaf tensor, copied and sent)")
            problems.extend(test)
    print("\n".join(lines))
    if problems:
        for problem in problems:
            print(f"  problem: {problem}")
        if not said_at_startup:  # stderr had its one line as Python started
            print(f"deepcopy_shim --check: {problems[0]}", file=sys.stderr)
        return 1
    print("all good; paste this output into bug reports")
    return 0
