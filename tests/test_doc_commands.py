"""Every shell command in the documentation runs as written.

Every ```bash, ```sh and ```console block of README.md, RELEASING.md and docs/*.md is a test.  Its
commands (for ```console, the lines after ``$ ``) run one at a time, each in a fresh
``bash -euo pipefail``, in the venv this suite runs in (the one the README's set-up command
makes: ``.venv/bin/...`` in a command means this interpreter's bin directory, which also comes
first on PATH, so ``python``, ``pytest`` and ``deepcopy-shim`` are the venv's), and each must exit 0.

Where they run, so that the working tree is never touched:

* in a copy of the repository (without .git, .venv, .tox and build output), made once per session;
* commands that run the reader's own program or tests (``train.py``, ``my_pkg.train``, a bare
  ``pytest``) in a scratch directory holding a stand-in for them: a script that deep-copies a
  model holding a non-leaf tensor, which fails unless the command really switched the shim on.

Long commands run with their quick options (``QUICK`` below says which, and why).  A block that
cannot run here -- an install into this environment, a fresh venv, the tox matrix, CI itself, an
upload, a server, a host this machine cannot reach -- must say so on the line before it:

    <!-- doc-commands: skip (needs a release on PyPI) -->

An unmarked block holding such a command fails (``CANNOT_RUN_HERE`` lists the patterns), and so
does a marker that is not right before a block.  Identical commands run once per session.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "RELEASING.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # not resolved: a venv's python is a symlink out of the venv

FENCE_OPEN = re.compile(r"^```(bash|sh|console)\s*$")
MARKER = re.compile(r"^<!--\s*doc-commands:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s*\((.+)\)\s*$")
COMMENT = re.compile(r"^<!--.*-->\s*$")

# Commands that cannot run inside this suite: an unmarked block holding one fails.
CANNOT_RUN_HERE: List[Tuple[str, str]] = [
    (r"\bpip3?\s+install\b|-m\s+pip\s+install\b", "installs into the environment the tests run in"),
    (r"-m\s+venv\b", "creates a fresh venv and installs into it (a minute or more)"),
    (r"\btox\b", "the tox matrix: downloads a torch build per environment"),
    (r"\.ci/(run|matrix|package)\b", "CI itself: minutes, and it runs this suite"),
    (r"\btwine\s+upload\b|-m\s+twine\s+upload\b", "uploads a release"),
    (r"\bgit\s+(push|tag|commit|clone)\b", "changes a repository"),
    (r"\bmkdocs\s+serve\b", "a server that runs until it is stopped"),
    (r"download\.pytorch\.org|test\.pypi\.org", "a host this machine cannot reach"),
]

# Commands run in the scratch directory with the stand-in program rather than the repository.
READERS_PROGRAM = re.compile(r"\btrain\.py\b|\bmy_pkg\b|\bmy_package\b|^(\S+=\S+\s+)*pytest\b")


def _bench_quick(command: str) -> str:
    # --quick is the benchmark's smoke run (~1 minute for all seven models); one model keeps this
    # file within its time budget and still runs every method, the table, the plot and the targets.
    if "--quick" not in command:
        command += " --quick"
    if "--only" not in command:
        command += ' --only "module-heavy"'
    return command


def _startup_quick(command: str) -> str:
    # Builds the wheel and two venvs either way; a few rounds of timing are enough to run it all.
    command = re.sub(r"--runs\s+\d+", "--runs 3", command)
    return re.sub(r"--torch-runs\s+\d+", "--torch-runs 1", command)


def _sending_quick(command: str) -> str:
    # 51 rounds of six cases, ~20 s; three rounds run every case and print the table.
    return command + " --runs 3 --warmup 1"


def _suite_quick(command: str) -> str:
    # The README's test command is the whole suite, this file included: collect it, which checks
    # the command line and that every test module imports (under coverage, as written, with the
    # report's floor off: a collection alone covers little).
    command = re.sub(r"(-m\s+pytest\b[^&]*)", r"\1 --collect-only -q ", command, count=1)
    return re.sub(r"(-m\s+coverage\s+report\b)", r"\1 --fail-under=0", command)


# Commands that need a module only the dev extra installs: skipped where it is missing (the tox
# environments install only the test extra), run in the venv of the README's set-up command.
NEEDS: List[Tuple[str, str]] = [
    (r"benchmarks/bench_copy\.py", "matplotlib"),
    (r"\bmkdocs\b", "mkdocs"),
    (r"-m\s+coverage\b", "coverage"),
]

# (pattern, rewrite): long commands and the quick form they run in here.
QUICK: List[Tuple[str, Callable[[str], str]]] = [
    (r"benchmarks/bench_copy\.py", _bench_quick),
    (r"benchmarks/startup_activation\.py", _startup_quick),
    (r"benchmarks/bench_sending\.py", _sending_quick),
    (r"^\S*python3?\s+-m\s+(coverage\s+run\s+-m\s+)?pytest\b", _suite_quick),
]


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    marker: Optional[str]  # the text after "doc-commands:", or None

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> List[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: List[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE_OPEN.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        marker = None
        above = index - 1
        while above >= 0 and COMMENT.match(lines[above]):  # the comments right above the fence
            match = MARKER.match(lines[above])
            if match:
                marker = match.group(1)
            above -= 1
        found.append(Block(page, index + 1, opening.group(1), "\n".join(lines[index + 1:end]), marker))
        index = end + 1
    return found


def _complete(command: str) -> bool:
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def commands(block: Block) -> List[str]:
    """The block's commands, continuation lines joined, comments and (console) output left out."""
    found: List[str] = []
    pending = ""
    for raw in block.text.splitlines():
        if not pending:
            if block.language == "console":
                if not raw.startswith("$ "):
                    continue  # output
                raw = raw[2:]
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
        pending = f"{pending}\n{raw}" if pending else raw
        if _complete(pending):
            found.append(pending)
            pending = ""
    if pending:
        found.append(pending)
    return found


def cannot_run_here(command: str) -> Optional[str]:
    code = " ".join(shlex.split(command, comments=True)) if _complete(command) else command
    for pattern, why in CANNOT_RUN_HERE:
        if re.search(pattern, code):
            return why
    return None


def without_comment(command: str) -> str:
    """``command`` without a trailing ``# comment`` (a ``#`` that starts a word, outside quotes)."""
    quote = ""
    for index, char in enumerate(command):
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or command[index - 1].isspace()):
            return command[:index].rstrip()
    return command


def as_run_here(command: str) -> str:
    command = without_comment(command)
    command = re.sub(r"(?<![\w/.])\.venv/bin/", f"{BIN}/", command)
    for pattern, rewrite in QUICK:
        if re.search(pattern, command, re.M):
            command = rewrite(command)
    return command


ALL_BLOCKS = [block for page in PAGES if page.exists() for block in blocks(page)]


# --- where the commands run ---------------------------------------------------------------

STAND_IN_PROGRAM = '''
"""Stand-in for the reader's program in the documentation's commands: it deep-copies a model
holding a cached activation (a tensor with autograd history), which only works with the shim on."""
import argparse
import copy

import torch
import torch.nn as nn

import deepcopy_shim

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.parse_args()
model = nn.Linear(2, 2)
model.out = model(torch.ones(1, 2))
try:
    ema = copy.deepcopy(model)
except deepcopy_shim.NonLeafTensorError:
    print("stand-in: refused, as mode strict does")
else:
    assert ema.out.grad_fn is None
    print("stand-in: copied")
'''

STAND_IN_TESTS = '''
import copy
import os

import pytest
import torch
import torch.nn as nn

import deepcopy_shim


def test_copy_follows_the_session_mode():
    model = nn.Linear(2, 2)
    model.out = model(torch.ones(1, 2))
    mode = os.environ.get("DEEPCOPY_SHIM")  # set by the plugin for the session; unset when off
    if mode in ("warn", "silent"):
        assert copy.deepcopy(model).out.grad_fn is None
    elif mode == "strict":
        with pytest.raises(deepcopy_shim.NonLeafTensorError):
            copy.deepcopy(model)
    else:
        with pytest.raises(RuntimeError, match="graph leaves"):
            copy.deepcopy(model)
'''


@pytest.fixture(scope="session")
def repo_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("doc-commands") / "repo"
    shutil.copytree(ROOT, copy, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".venv-*", ".tox", "build", "dist", "site", "__pycache__", "*.egg-info",
        ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".coverage*",
    ))
    return copy


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("doc-commands-program")
    (path / "train.py").write_text(textwrap.dedent(STAND_IN_PROGRAM))
    for package in ("my_pkg", "my_package"):
        (path / package).mkdir()
        (path / package / "__init__.py").write_text("")
        (path / package / "train.py").write_text(textwrap.dedent(STAND_IN_PROGRAM))
    (path / "test_program.py").write_text(textwrap.dedent(STAND_IN_TESTS))
    (path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no configuration from above
    return path


def _environment() -> Dict[str, str]:
    env = {
        key: value for key, value in os.environ.items()
        if key != "DEEPCOPY_SHIM" and not key.startswith(("PYTEST_", "COV_CORE_", "COVERAGE_"))
    }
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(BIN.parent)
    env["MPLBACKEND"] = "Agg"
    return env


_RESULTS: Dict[Tuple[str, str], Tuple[int, str]] = {}


def run(command: str, cwd: Path) -> Tuple[int, str]:
    key = (command, str(cwd))
    if key not in _RESULTS:
        try:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=_environment(),
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
            )
            _RESULTS[key] = (done.returncode, done.stdout + done.stderr)
        except subprocess.TimeoutExpired as exc:
            _RESULTS[key] = (-1, f"timed out after {exc.timeout} s")
    return _RESULTS[key]


# --- the tests ----------------------------------------------------------------------------


def test_the_pages_have_shell_blocks() -> None:
    """Guards the extraction itself: the README's set-up and test commands are among the blocks."""
    readme = [block for block in ALL_BLOCKS if block.page.name == "README.md"]
    texts = "\n".join(block.text for block in readme)
    assert "python3 -m venv .venv" in texts and "-m pytest" in texts
    assert len(ALL_BLOCKS) >= 10


def test_every_marker_is_right_above_a_block() -> None:
    misplaced = []
    for page in PAGES:
        if not page.exists():
            continue
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            match = MARKER.match(line)
            if not match:
                if line.lstrip().startswith("<!--") and "doc-commands" in line:
                    misplaced.append(f"{page.name}:{number + 1}: not a marker: {line.strip()}")
                continue
            if not SKIP.match(match.group(1)):
                misplaced.append(f"{page.name}:{number + 1}: write `doc-commands: skip (why)`")
            below = number + 1
            while below < len(lines) and COMMENT.match(lines[below]):
                below += 1
            if below >= len(lines) or not FENCE_OPEN.match(lines[below]):
                misplaced.append(f"{page.name}:{number + 1}: not right above a bash/sh/console block")
    assert not misplaced, "\n".join(misplaced)


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda block: block.id)
def test_commands_run_as_written(block: Block, repo_copy: Path, scratch: Path) -> None:
    if block.marker is not None:
        skip = SKIP.match(block.marker)
        assert skip, f"{block.id}: a doc-commands marker must read `doc-commands: skip (why)`"
        pytest.skip(f"{block.id}: marked skip ({skip.group(1)})")
    found = commands(block)
    assert found, f"{block.id}: an empty shell block"
    for command in found:
        why = cannot_run_here(command)
        assert why is None, (
            f"{block.id}: `{command}` cannot run here ({why}); mark the block with "
            f"<!-- doc-commands: skip (reason) --> on the line before it"
        )
    for command in found:
        for pattern, module in NEEDS:
            if re.search(pattern, command) and importlib.util.find_spec(module) is None:
                pytest.skip(f"{block.id}: needs {module}, which the dev extra installs "
                            "(the README's set-up command)")
    for command in found:
        here = as_run_here(command)
        cwd = scratch if READERS_PROGRAM.search(command) else repo_copy
        returncode, output = run(here, cwd)
        assert returncode == 0, (
            f"{block.id}: `{command}` failed (ran `{here}` in {cwd}, exit {returncode}):\n"
            + output[-4000:]
        )
