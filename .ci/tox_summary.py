"""Print one line per tox environment from ``tox --result-json`` and fail unless all passed.

Usage: python .ci/tox_summary.py RESULT.json ENV [ENV ...]

Every ENV named must appear in the result, have run pytest with exit status 0 and have at least
one test passed; an environment that failed while installing, or in which pytest collected
nothing ("no tests ran", exit status 5), fails the run.

       python .ci/tox_summary.py --pytest-log LOG

Prints the counts of pytest's last summary line in LOG (any text holding pytest's output, such
as a tox log), tab-separated: passed, failed, skipped, xfailed, errors, then the summary line
itself (empty, and all counts 0, when there is none).  This is how .ci/matrix reads its logs, so
the one parser here (``pytest_summary``, ``counts``) serves both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List

SUMMARY = re.compile(
    r"^=+ (.*(?:passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s.*?) =+$", re.M
)
# The counts reported, in the order --pytest-log prints them; "errors" also matches "1 error".
COUNTED = ("passed", "failed", "skipped", "xfailed", "errors")


def pytest_summary(output: str) -> str:
    """pytest's last summary line in ``output`` ("12 passed, 1 skipped in 3.1s"), or ""."""
    summaries = SUMMARY.findall(output)
    return summaries[-1] if summaries else ""


def counts(summary: str) -> Dict[str, int]:
    """The numbers of a summary line, one per word of ``COUNTED`` (0 for a word not there)."""
    found = {}
    for word in COUNTED:
        pattern = r"errors?" if word == "errors" else word
        match = re.search(rf"(?<![\w-])(\d+) {pattern}\b", summary)
        found[word] = int(match.group(1)) if match else 0
    return found


_PROBE = (
    "import platform, torch, wrapt; "
    "print(torch.__version__, wrapt.__version__, platform.python_version())"
)


def _versions(name: str, env: Dict[str, Any], work_dir: str) -> str:
    installed: Dict[str, str] = {}
    for line in env.get("installed_packages", []):
        package, _, version = line.partition("==")
        installed[package.lower()] = version
    python = ".".join(str(part) for part in env.get("python", {}).get("version_info", [])[:3])
    torch, wrapt = installed.get("torch"), installed.get("wrapt")
    if torch is None or wrapt is None:
        # tox 4.67 records no installed_packages for an environment it has just recreated:
        # ask the environment's own interpreter (tox's default env_dir, beside the result file).
        interpreter = os.path.join(work_dir, name, "bin", "python")
        if os.path.exists(interpreter):
            probe = subprocess.run(
                [interpreter, "-c", _PROBE], capture_output=True, text=True, check=False
            )
            if probe.returncode == 0 and len(probe.stdout.split()) == 3:
                torch, wrapt, python = probe.stdout.split()
    return f"torch {torch or '?'}, wrapt {wrapt or '?'}, Python {python or '?'}"


def _setup_failure(env: Dict[str, Any], package: Dict[str, Any], work_dir: str) -> str:
    """Why an environment ran no test, in one line: CI shows only the end of its output.

    The failing set-up step and its first error line (pip's "ERROR: ..."), or the package build's
    (tox's `.pkg` environment, `package`) last line where that build raised; and the disk space
    left where the environments live: a full disk is the usual cause on a fresh machine, and
    pip's own words for it ("No space left on device") scroll away with the rest of its output.
    """
    free = f"{shutil.disk_usage(work_dir).free / 2**30:.1f} GiB free on its disk"
    failed = [c for c in env.get("setup", []) if c.get("retcode") not in (0, None)]
    if failed:
        step = failed[-1]
        return f"{step.get('run_id', 'set-up')} failed: {_error_line(step)}; {free}"
    # tox records a failed package build under `.pkg`, with no exit status, not under the env.
    raised = [c for c in package.get("setup", []) if "Error" in c.get("err", "")]
    if raised:
        return f"its package build failed: {_error_line(raised[-1])}; {free}"
    return f"not set up; {free}"


def _error_line(step: Dict[str, Any]) -> str:
    """The first error line of a step's standard error (pip writes the cause first, then
    hints), else its last line, else its exit status."""
    lines: List[str] = [line.strip() for line in step.get("err", "").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"(?i)error\b", line)]
    if errors:
        return errors[0]
    return lines[-1] if lines else f"exit status {step.get('retcode')}"


def pytest_log(path: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as handle:
        summary = pytest_summary(handle.read())
    found = counts(summary)
    print("\t".join([*(str(found[word]) for word in COUNTED), summary]))
    return 0


def main(argv: List[str]) -> int:
    if argv[:1] == ["--pytest-log"]:
        if len(argv) != 2:
            sys.exit("usage: tox_summary.py --pytest-log LOG")
        return pytest_log(argv[1])
    path, expected = argv[0], argv[1:]
    work_dir = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as handle:
        envs: Dict[str, Any] = json.load(handle).get("testenvs", {})
    failures = 0
    for name in expected:
        env: Dict[str, Any] = envs.get(name) or {}
        commands = env.get("test", [])
        if not commands:
            why = _setup_failure(env, envs.get(".pkg") or {}, work_dir)
            print(f"FAIL {name}: did not run its tests ({why})")
            failures += 1
            continue
        output = "".join(command.get("output", "") for command in commands)
        summary = pytest_summary(output) or "no pytest summary line"
        retcodes = [command.get("retcode") for command in commands]
        ok = all(code == 0 for code in retcodes) and counts(summary)["passed"] > 0
        print(f"{'PASS' if ok else 'FAIL'} {name} ({_versions(name, env, work_dir)}): {summary}")
        failures += not ok
    print(f"tox: {len(expected) - failures} of {len(expected)} environments passed")
    return 1 if failures or not expected else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
