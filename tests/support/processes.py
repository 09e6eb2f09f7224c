"""Helpers for the tests that start child interpreters (subprocesses, clean environments, a model to copy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

REPO = Path(__file__).resolve().parents[2]

# A model whose last forward ran with grad enabled: its cached activations are non-leaf tensors,
# so a native copy.deepcopy raises the 'graph leaves' error.  Pasted into child programs.
CHILD_NET_SRC = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class ChildNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 8)
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            hidden = self.fc(x)
            self.last_hidden = hidden.relu()
            return self.head(hidden)

    def make_child_net(seed=0):
        torch.manual_seed(seed)
        net = ChildNet()
        net(torch.randn(3, 4))
        assert not net.last_hidden.is_leaf
        return net
    """
)

# Reports, without importing anything, what the start-up hook did in this interpreter.
PROBE_SRC = textwrap.dedent(
    """
    import sys
    modes = sys.modules.get("deepcopy_shim._modes")
    setting = modes.global_setting() if modes is not None else None
    print("mode=%s torch=%s shim=%s wrapt=%s" % (
        setting.mode.value if setting is not None else None, "torch" in sys.modules,
        "deepcopy_shim" in sys.modules, "wrapt" in sys.modules))
    """
)


def clean_env(value: Optional[str] = None, **extra: str) -> Dict[str, str]:
    """The test process's environment without any activation, plus DEEPCOPY_SHIM=value if given.

    PYTHONPATH is dropped so that a child sees only its own environment's packages.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEEPCOPY_SHIM", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONNOUSERSITE")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if value is not None:
        env["DEEPCOPY_SHIM"] = value
    env.update(extra)
    return env


def same_code_env(value: Optional[str] = None, **extra: str) -> Dict[str, str]:
    """`clean_env()`, but keeping PYTHONPATH: a child that must import the very package this
    test process imports (a mutation run's mutated copy, say), not its environment's install."""
    env = clean_env(value, **extra)
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def run(args: Sequence[Union[str, Path]], env: Dict[str, str], cwd: Optional[Path] = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def run_bounded(args: Sequence[Union[str, Path]], env: Dict[str, str], cwd: Optional[Path] = None,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`run()` with a hard limit for a child that starts processes of its own (spawn and
    forkserver children, a forkserver, pool and DataLoader workers): the child runs in a session
    of its own, and at `timeout` it and every process it started are killed and the test fails
    with what they printed. A hang fails; it never blocks the suite, and nothing it started
    outlives it (a grandchild holding the pipes would make a plain `run()` wait for it)."""
    posix = hasattr(os, "killpg")
    proc = subprocess.Popen([str(a) for a in args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=posix)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if posix:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "", "(its output could not be read: a process outside its session holds it)"
        raise AssertionError(f"hung: killed after {timeout} s, with every process it started\n"
                             f"--- stdout\n{out}\n--- stderr\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_code(python: Union[str, Path], code: str, env: Dict[str, str],
             cwd: Optional[Path] = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run([python, "-c", code], env=env, cwd=cwd, timeout=timeout)


def stderr_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr lines, less torch's own notice about numpy being absent (not ours to judge)."""
    return [line for line in proc.stderr.splitlines()
            if line.strip() and "Failed to initialize NumPy" not in line
            and "_conversion_method_template" not in line]


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


DEV_PYTHON = sys.executable


# The prelude of a child program that forks (run_forking): `fork_and(child)` runs `child()` in a
# forked process and returns its exit status; `removed()` says the patch is gone (torch's own
# function back), `disable_removes()` disables and says so as an exit status (0: removed).
_FORK_PRELUDE = """
import copy, os, threading, torch, deepcopy_shim
from deepcopy_shim import _patch
ORIGINAL = vars(torch.Tensor)["__deepcopy__"]
def removed():
    return _patch.state() == "off" and vars(torch.Tensor)["__deepcopy__"] is ORIGINAL
def disable_removes():
    deepcopy_shim.disable()
    return 0 if removed() else 4
def fork_and(child):
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = child()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
"""


def run_forking(code: str) -> str:
    """Run `code` (indented as it comes) after the fork prelude in a child interpreter that keeps
    this test's environment (PYTHONPATH: a mutation run's copy), the shim off at start; return
    its stderr, then its stdout (what the tests read ends it; torch may warn on stderr)."""
    done = subprocess.run([sys.executable, "-c", _FORK_PRELUDE + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DEEPCOPY_SHIM": ""})
    return done.stderr + done.stdout


def in_a_thread(work: Callable[[], Any], seconds: float = 20.0) -> Any:
    """`work()`'s result, run in a daemon thread that must finish within `seconds` (a copy or a
    read that waits for itself, holding a lock, would not)."""
    result: List[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "it hung: the shim re-entered code still running, or waited for itself"
    return result[0]
