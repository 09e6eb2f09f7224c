"""`python -m deepcopy_shim --check`: what a bug report needs, and a non-zero status when wrong."""

from __future__ import annotations

import platform
import sys
import warnings
from types import SimpleNamespace
from typing import Any, Callable, List, Optional, Tuple, Union

import pytest
import torch
import wrapt
from support.processes import DEV_PYTHON, REPO, clean_env, describe, run, stderr_lines

import deepcopy_shim
from deepcopy_shim import DetachedTensorsWarning, _doctor


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
    assert f"  platform       {platform.system()} {platform.release()} {platform.machine()}" in out
    assert f"  wrapt          {getattr(wrapt, '__version__', '?')} (tested: 1.14-2.5)" in lines
    assert f"  torch          {torch.__version__} (tested: 2.0-2.15)" in out
    assert "  DEEPCOPY_SHIM  unset (off)" in lines
    assert "  this process   mode off; patch off" in lines
    assert any(line.startswith("  gpu            ") for line in lines)
    assert lines[-1] == "all good; paste this output into bug reports"
    assert "self-test      ok" in out
    assert len(lines) <= 12
    assert not deepcopy_shim.is_enabled()  # the self-test leaves nothing enabled


def test_the_platform_line_names_the_system_the_machine_and_the_libc(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "release", lambda: "6.8.0-45-generic")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("glibc", "2.35"))
    assert _doctor._platform_line() == "Linux 6.8.0-45-generic aarch64, glibc 2.35"
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))  # musl
    assert _doctor._platform_line() == "Linux 6.8.0-45-generic aarch64, libc unknown"

    def unreadable() -> Tuple[str, str]:
        raise OSError("sys.executable cannot be read")

    monkeypatch.setattr(platform, "libc_ver", unreadable)
    assert _doctor._platform_line() == "Linux 6.8.0-45-generic aarch64, libc unknown"
    monkeypatch.setattr(platform, "system", lambda: "Windows")
    monkeypatch.setattr(platform, "release", lambda: "10")
    monkeypatch.setattr(platform, "machine", lambda: "AMD64")
    assert _doctor._platform_line() == "Windows 10 AMD64"  # no libc to name outside Linux
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "release", lambda: "23.4.0")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    assert _doctor._platform_line() == "Darwin 23.4.0 arm64"  # no libc to name outside Linux


def test_the_platform_line_is_this_machines(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = check(capsys)
    libc, version = platform.libc_ver()
    expected = f"  platform       {platform.system()} {platform.release()} {platform.machine()}"
    if libc:
        expected += f", {libc} {version}"
    assert expected in out.splitlines()


@pytest.mark.parametrize(("version", "note"), [
    ("1.14.0", "tested: 1.14-2.5"),
    ("2.5.2", "tested: 1.14-2.5"),
    ("1.13.3", "OLDER than the tested 1.14-2.5: not supported"),
    ("2.6.0", "newer than the tested 1.14-2.5: untested, the self-test below decides"),
])
def test_the_wrapt_line_says_whether_it_is_in_the_tested_range(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, version: str, note: str) -> None:
    monkeypatch.setattr(wrapt, "__version__", version)
    _, out, _ = check(capsys)
    assert f"  wrapt          {version} ({note})" in out.splitlines()


# --- what deepcopy-shim requires, read from its installed metadata (deepcopy_shim._tested) ------

def _with_requirements(monkeypatch: pytest.MonkeyPatch,
                       requirements: Union[List[str], BaseException]) -> None:
    """Make importlib.metadata answer `requirements` for deepcopy-shim (an exception: raise it)."""
    import importlib.metadata

    def requires(name: str) -> Optional[List[str]]:
        assert name == "deepcopy-shim"
        if isinstance(requirements, BaseException):
            raise requirements
        return requirements

    monkeypatch.setattr(importlib.metadata, "requires", requires)


def test_the_excluded_wrapt_is_named_with_the_command_that_mends_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapt, "__version__", "2.2.0")
    # the order of the metadata's lines and the extras' own requirements do not matter
    _with_requirements(monkeypatch, ['pytest>=7; extra == "test"', "wrapt (>=1.14,!=2.2.0)",
                                     "torch>=2.0", 'wrapt==2.2.0; extra == "dev"'])
    status, out, err = check(capsys)
    assert status == 1 and "  wrapt          2.2.0 (EXCLUDED by deepcopy-shim's requirements)" in out
    assert err == ("deepcopy_shim --check: wrapt 2.2.0 is excluded by deepcopy-shim's requirements "
                   '(a known regression): pip install --force-reinstall "wrapt>=1.14,!=2.2.0"\n')


def test_without_the_metadata_nothing_is_excluded_and_the_command_names_the_package(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree on sys.path has no installed metadata: the doctor judges by the tested range
    and says to reinstall the package by its name alone."""
    from importlib.metadata import PackageNotFoundError

    _with_requirements(monkeypatch, PackageNotFoundError("deepcopy-shim"))
    monkeypatch.setattr(wrapt, "__version__", "2.2.0")
    _, out, _ = check(capsys)
    assert "  wrapt          2.2.0 (tested: 1.14-2.5)" in out.splitlines()
    monkeypatch.setitem(sys.modules, "wrapt", None)
    status, out, err = check(capsys)
    assert status == 1 and "  wrapt          CANNOT BE IMPORTED" in out
    assert err.endswith(': pip install --force-reinstall "wrapt"\n'), err


@pytest.mark.parametrize("name", ["torch", "wrapt"])
def test_each_requirement_is_read_for_its_own_package(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    from deepcopy_shim._bootstrap import startup_failure

    for order in (["torch>=2.0", "wrapt>=1.14,!=2.2.0"], ["wrapt>=1.14,!=2.2.0", "torch>=2.0"]):
        _with_requirements(monkeypatch, order)
        line = startup_failure(ModuleNotFoundError(f"No module named '{name}'", name=name), "x")
        wanted = "torch>=2.0" if name == "torch" else "wrapt>=1.14,!=2.2.0"
        assert line.endswith(f'; to fix it: pip install --force-reinstall "{wanted}"'), (order, line)


def test_the_installed_metadata_is_what_the_package_requires() -> None:
    """The real metadata (the editable install): the commands quote pyproject.toml's requirements
    (the metadata may order a requirement's specifiers its own way)."""
    import re

    from deepcopy_shim._bootstrap import startup_failure

    dependencies = (REPO / "pyproject.toml").read_text().split("dependencies = [", 1)[1].split("]", 1)[0]
    for name in ("torch", "wrapt"):
        (declared,) = re.findall(rf'"{name}([^"]*)"', dependencies)
        line = startup_failure(ModuleNotFoundError("x", name=name), "x")
        quoted = re.fullmatch(rf'.*; to fix it: pip install --force-reinstall "{name}([^"]*)"', line)
        assert quoted is not None, line
        assert sorted(quoted.group(1).split(",")) == sorted(declared.replace(" ", "").split(",")), line


def fake_torch(cuda: Optional[str] = None, hip: Optional[str] = None, available: Any = False,
               names: Tuple[str, ...] = (), mps: Optional[bool] = None) -> Any:
    """A stand-in with torch's query functions; `available` may be a callable that raises."""
    def is_available() -> bool:
        warnings.warn("CUDA initialization: Found no NVIDIA driver on your system.", stacklevel=2)
        return available() if callable(available) else bool(available)

    def get_device_name(index: int) -> str:
        return names[index]

    def mps_is_built() -> bool:
        if mps is None:
            raise AttributeError("no torch.backends.mps in this torch")
        return True

    return SimpleNamespace(
        version=SimpleNamespace(cuda=cuda, hip=hip),
        cuda=SimpleNamespace(is_available=is_available, device_count=lambda: len(names),
                             get_device_name=get_device_name),
        backends=SimpleNamespace(mps=SimpleNamespace(is_built=mps_is_built, is_available=lambda: bool(mps))),
    )


def _refuse_at_length(length: int) -> bool:
    raise RuntimeError("x" * length)  # the reason is cut at 200 characters, "RuntimeError: " included


def _refuse() -> bool:
    raise RuntimeError("CUDA driver initialization failed,\nyou might not have a CUDA gpu.")


@pytest.mark.parametrize(("torch_like", "line"), [
    (fake_torch(), "no CUDA (torch built without CUDA)"),
    (fake_torch(cuda="12.8"), "no CUDA: torch built with CUDA 12.8, no device visible (no driver or no GPU)"),
    (fake_torch(cuda="12.8", available=_refuse),
     "no CUDA: torch built with CUDA 12.8, its device query failed (RuntimeError: CUDA driver "
     "initialization failed, you might not have a CUDA gpu.)"),
    (fake_torch(cuda="12.8", available=True, names=("NVIDIA H200",)), "CUDA 12.8, 1 device: NVIDIA H200"),
    (fake_torch(cuda="12.8", available=True, names=("NVIDIA H200", "NVIDIA H200")),
     "CUDA 12.8, 2 devices: NVIDIA H200 x2"),
    (fake_torch(cuda="12.1", available=True, names=("NVIDIA A100-SXM4-80GB", "Tesla T4")),
     "CUDA 12.1, 2 devices: NVIDIA A100-SXM4-80GB, Tesla T4"),
    (fake_torch(hip="6.2.41133", available=True, names=("AMD Instinct MI300X",)),
     "ROCm/HIP 6.2.41133, 1 device: AMD Instinct MI300X"),
    (fake_torch(cuda="12.8", available=lambda: _refuse_at_length(300)),
     "no CUDA: torch built with CUDA 12.8, its device query failed (RuntimeError: " + "x" * 186 + ")"),
    (fake_torch(mps=True), "no CUDA (torch built without CUDA); MPS available"),
    (fake_torch(mps=False), "no CUDA (torch built without CUDA); MPS built, not available"),
])
def test_the_gpu_line(torch_like: Any, line: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _doctor._gpu_line(torch_like) == line
    assert caught == []  # torch's "no driver" warning is not the user's business here


def test_a_device_that_cannot_be_named_is_still_counted() -> None:
    torch_like = fake_torch(cuda="12.8", available=True, names=("NVIDIA H200",))
    torch_like.cuda.device_count = lambda: 2  # names[1] raises IndexError
    line = _doctor._gpu_line(torch_like)
    assert line == "CUDA 12.8, 2 devices: NVIDIA H200, device 1 unreadable (IndexError)"


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, version: Optional[str], names: List[str]) -> None:
    monkeypatch.setattr(torch.version, "cuda", version)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    get_name: Callable[[int], str] = names.__getitem__
    monkeypatch.setattr(torch.cuda, "get_device_name", get_name)


@pytest.mark.parametrize(("version", "names", "line"), [
    (None, [], "no CUDA (torch built without CUDA)"),
    ("12.8", [], "no CUDA: torch built with CUDA 12.8, no device visible (no driver or no GPU)"),
    ("12.8", ["NVIDIA H200", "NVIDIA H200"], "CUDA 12.8, 2 devices: NVIDIA H200 x2"),
])
def test_the_report_has_the_gpu_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                     version: Optional[str], names: List[str], line: str) -> None:
    monkeypatch.delenv("DEEPCOPY_SHIM", raising=False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    _fake_cuda(monkeypatch, version, names)
    status, out, err = check(capsys)
    assert status == 0 and err == ""  # no GPU is information, not a problem
    assert f"  gpu            {line}" in out.splitlines()


def test_the_gpu_line_is_this_machines(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = check(capsys)
    (line,) = [line for line in out.splitlines() if line.startswith("  gpu ")]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert f", {count} device{'s' if count > 1 else ''}: " in line
        assert torch.cuda.get_device_name(0) in line
    else:  # "no CUDA (torch built without CUDA)" or "no CUDA: torch built with CUDA 11.7, ..."
        assert line.split()[1] == "no" and line.split()[2].rstrip(":") == "CUDA"


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


def test_a_bad_variable_is_one_line_on_stderr_and_one_problem_in_the_report() -> None:
    """As docs/diagnostics.md says: status 1, one line on stderr (the start-up hook's, which
    speaks first, as Python starts; the doctor does not say it again), and in the report its
    row marked and one `problem:` line."""
    for command in ([DEV_PYTHON, "-m", "deepcopy_shim", "--check"],
                    [str(__import__("pathlib").Path(DEV_PYTHON).parent / "deepcopy-shim"), "--check"]):
        proc = run(command, clean_env("strcit"))
        assert proc.returncode == 1, describe(proc)
        (said,) = stderr_lines(proc)
        assert said.startswith("deepcopy_shim: invalid DEEPCOPY_SHIM value 'strcit' (did you mean "
                               "'strict'?); valid values are warn, strict, silent"), describe(proc)
        complaints = [line for line in proc.stdout.splitlines() if "strcit" in line]
        assert complaints == [
            "  DEEPCOPY_SHIM  'strcit': INVALID",
            "  problem: " + said.split("deepcopy_shim: ", 1)[1].split("; start-up activation", 1)[0],
        ], describe(proc)
        assert proc.stdout.count("problem:") == 1


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
        assert f"  platform       {platform.system()} " in proc.stdout
        assert "  gpu            " in proc.stdout


# --- the broken set-ups the doctor exists for: a report and one line, never a traceback -------

_DOCTOR = ("import runpy, sys\nsys.argv = ['deepcopy_shim', '--check']\n"
           "runpy.run_module('deepcopy_shim', run_name='__main__')\n")
_BROKEN = {
    # wrapt cannot be imported at all (a broken or missing install)
    "wrapt unimportable": ("import sys\nsys.modules['wrapt'] = None\n",
                           "wrapt cannot be imported", "wrapt          CANNOT BE IMPORTED"),
    # another patch replaced copy's dispatch table with something that is not a dict
    "foreign copy table": (
        "import copy, types\n"
        "copy._deepcopy_dispatch = types.MappingProxyType(dict(copy._deepcopy_dispatch))\n",
        "cannot install: copy._deepcopy_dispatch is not the dict", "self-test      FAILED"),
    # the wrapt release the package metadata excludes
    "excluded wrapt": ("import wrapt\nwrapt.__version__ = '2.2.0'\n",
                       "wrapt 2.2.0 is excluded", "EXCLUDED by deepcopy-shim's requirements"),
}


@pytest.mark.parametrize("setup", sorted(_BROKEN))
def test_a_broken_set_up_gets_the_report_and_one_line_saying_what_and_how_to_fix_it(setup: str) -> None:
    prelude, problem, line = _BROKEN[setup]
    proc = run([DEV_PYTHON, "-c", prelude + _DOCTOR], env=clean_env())
    assert proc.returncode == 1, describe(proc)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, describe(proc)
    assert proc.stdout.splitlines()[0].startswith("deepcopy-shim "), describe(proc)
    assert line in proc.stdout, describe(proc)
    (said,) = stderr_lines(proc)
    assert said.startswith("deepcopy_shim --check: ") and problem in said, describe(proc)
    if "wrapt" in setup:  # how to fix it
        assert 'pip install --force-reinstall "wrapt' in said and "!=2.2.0" in said, describe(proc)


def test_the_start_up_line_for_a_requirement_that_cannot_be_imported_says_how_to_fix_it() -> None:
    proc = run([DEV_PYTHON, "-c", "import sys\nsys.modules['wrapt'] = None\n"
                "from deepcopy_shim._bootstrap import activate_from_environment\n"
                "activate_from_environment({'DEEPCOPY_SHIM': 'warn'})\n"], env=clean_env())
    (said,) = stderr_lines(proc)
    assert "start-up activation by DEEPCOPY_SHIM failed (ModuleNotFoundError" in said, describe(proc)
    assert 'the shim stays off; to fix it: pip install --force-reinstall "wrapt' in said, describe(proc)


# --- the self-test judges what the shim does: each way of getting it wrong is named ----------

def _misbehaving(monkeypatch: pytest.MonkeyPatch, **per_mode: Callable[[torch.Tensor], Any]) -> None:
    """Make copy.deepcopy, for the modes named (off, silent, warn, strict), do what is given."""
    import copy

    real = copy.deepcopy

    def deepcopy(x: Any, memo: Any = None) -> Any:
        mode = deepcopy_shim.current_mode()
        how = per_mode.get(mode.mode.value if mode is not None else "off")
        # Tensors only: torch's own Tensor.__deepcopy__ deep-copies the storage (the send's copy).
        return real(x, memo) if how is None or not isinstance(x, torch.Tensor) else how(x)

    monkeypatch.setattr(copy, "deepcopy", deepcopy)


def _raise(error: BaseException) -> Callable[[torch.Tensor], Any]:
    def raises(_: torch.Tensor) -> Any:
        raise error
    return raises


def _warns(*categories: type) -> Callable[[torch.Tensor], Any]:
    def warns(t: torch.Tensor) -> Any:
        for category in categories:
            warnings.warn("x", category, stacklevel=1)
        return t.detach().clone().requires_grad_()
    return warns


def _refused(paths: Tuple[str, ...]) -> Callable[[torch.Tensor], Any]:
    def refuses(t: torch.Tensor) -> Any:
        raise deepcopy_shim.NonLeafTensorError("refused", paths=paths, mode=deepcopy_shim.Mode.STRICT,
                                               tensors=[t] * len(paths))
    return refuses


_WRONG = {
    "torch copies itself": ({"off": lambda t: t.detach()},
                            "torch copies non-leaf tensors itself: the shim is not needed here"),
    "another refusal": ({"off": _raise(RuntimeError("no"))},
                        "torch refuses non-leaf tensors with an unknown message: no"),
    "silent keeps history": ({"silent": lambda t: t * 1}, "mode silent did not make a detached leaf"),
    "silent drops requires_grad": ({"silent": lambda t: t.detach().clone()}, "mode silent did not make"),
    "silent other values": ({"silent": lambda t: (t.detach() + 1).requires_grad_()},
                            "mode silent did not make"),
    "silent shares the storage": ({"silent": lambda t: t.detach().requires_grad_()},
                                  "mode silent did not make"),
    "warn silent": ({"warn": _warns()}, "mode warn emitted [], not one DetachedTensorsWarning"),
    "warn twice": ({"warn": _warns(DetachedTensorsWarning, DetachedTensorsWarning)},
                   "mode warn emitted ['DetachedTensorsWarning', 'DetachedTensorsWarning']"),
    "warn another warning": ({"warn": _warns(UserWarning)}, "mode warn emitted ['UserWarning']"),
    "strict copies": ({"strict": lambda t: t.detach().clone()}, "mode strict copied a non-leaf tensor"),
    "strict names another": ({"strict": _refused(("x",))}, "mode strict named ('x',), not the copied"),
    "strict names nothing": ({"strict": _refused(())}, "mode strict named (), not the copied tensor"),
}


@pytest.mark.parametrize("wrong", sorted(_WRONG))
def test_the_self_test_names_each_way_the_shim_can_get_it_wrong(
        monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    per_mode, problem = _WRONG[wrong]
    _misbehaving(monkeypatch, **per_mode)
    found = _doctor._self_test()
    assert len(found) == 1 and found[0].startswith(problem), found


def test_the_self_test_passes_on_the_real_shim() -> None:
    assert _doctor._self_test() == []


def test_without_wrapt_the_self_test_is_skipped_and_without_torch_it_is_a_problem(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wrapt", None)
    _, out, _ = check(capsys)
    assert "  self-test      skipped (the patch needs wrapt)" in out.splitlines()
    monkeypatch.setitem(sys.modules, "torch", None)
    status, out, _ = check(capsys)
    assert status == 1 and "  torch " not in out and "self-test" not in out
    assert "  problem: torch cannot be imported (ModuleNotFoundError: import of torch halted; None in " \
           "sys.modules)" in out.splitlines()


def test_a_self_test_that_cannot_run_says_why_once(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_install() -> List[str]:
        raise RuntimeError("deepcopy_shim: cannot install: copy._deepcopy_dispatch is\n   not the "
                           "dict the standard library makes (set by deepcopy_shim: a test)")

    monkeypatch.setattr(_doctor, "_self_test", cannot_install)
    status, out, err = check(capsys)
    said = ("cannot install: copy._deepcopy_dispatch is not the dict the standard library makes "
            "(set by deepcopy_shim: a test)")
    assert status == 1 and f"  problem: {said}" in out.splitlines()
    assert err == f"deepcopy_shim --check: {said}\n"


def test_the_one_line_names_the_first_problem_and_a_value_is_quoted_whole(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_doctor, "find_startup_hook", lambda: None)
    monkeypatch.setenv("DEEPCOPY_SHIM", "deepcopy_shim: loud")
    status, out, err = check(capsys)
    problems = [line for line in out.splitlines() if line.startswith("  problem: ")]
    assert status == 1 and len(problems) == 2
    assert problems[1].startswith("  problem: invalid DEEPCOPY_SHIM value 'deepcopy_shim: loud'")
    assert err == f"deepcopy_shim --check: {problems[0][len('  problem: '):]}\n"
    assert "deepcopy_shim.pth is not in this environment's site-packages" in err


# --- the self-test of sending to another process: each way of getting it wrong is named ------

def _sends_the_source(self: Any, tensor: torch.Tensor, original: Any, deepcopy: Any) -> Any:
    self.met.append(tensor)
    return original(tensor.detach())  # no copy: the receiver would share the sender's memory


def _warns_twice(self: Any) -> None:
    for _ in range(2 if self.setting.mode is deepcopy_shim.Mode.WARN else 0):
        warnings.warn("x", DetachedTensorsWarning, stacklevel=1)


def _names_another(self: Any, tensor: torch.Tensor, torch_words: str) -> Any:
    return deepcopy_shim.NonLeafTensorError("refused", paths=("x",))


_WRONG_SENDS = {
    "silent shares the source": ("detached", _sends_the_source,
                                 "mode silent did not send a detached leaf copy with equal values"),
    "warn twice": ("report", _warns_twice, "mode warn emitted ['DetachedTensorsWarning', "
                                           "'DetachedTensorsWarning'] on a send"),
    "strict names another": ("refusal", _names_another,
                             "mode strict named ('x',) and gave RuntimeError("),
}


@pytest.mark.parametrize("wrong", sorted(_WRONG_SENDS))
def test_the_self_test_names_each_way_a_send_can_go_wrong(
        monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    from deepcopy_shim import _sending

    method, replacement, problem = _WRONG_SENDS[wrong]
    monkeypatch.setattr(_sending.Send, method, replacement)
    found = _doctor._self_test()
    assert len(found) == 1 and found[0].startswith(problem), found
