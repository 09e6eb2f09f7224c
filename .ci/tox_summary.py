"""Print one line per tox environment from ``tox --result-json`` and fail unless all passed.

Usage: python .ci/tox_summary.py RESULT.json ENV [ENV ...]

Every ENV named must appear in the result, have run pytest with exit status 0 and have at least
one test passed; an environment that failed while installing, or in which pytest collected
nothing ("no tests ran", exit status 5), fails the run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List

SUMMARY = re.compile(
    r"^=+ (.*(?:passed|failed|error|skipped|deselected|no tests ran).* in [0-9.]+s.*?) =+$", re.M
)


def _count(word: str, summary: str) -> int:
    match = re.search(rf"(\d+) {word}\b", summary)
    return int(match.group(1)) if match else 0


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


def main(argv: List[str]) -> int:
    path, expected = argv[0], argv[1:]
    work_dir = os.path.dirname(os.path.abspath(path))
    with open(path, encoding="utf-8") as handle:
        envs: Dict[str, Any] = json.load(handle).get("testenvs", {})
    failures = 0
    for name in expected:
        env = envs.get(name)
        commands = env.get("test", []) if env else []
        if not commands:
            print(f"FAIL {name}: did not run its tests (set-up failed; see the tox output above)")
            failures += 1
            continue
        output = "".join(command.get("output", "") for command in commands)
        summaries = SUMMARY.findall(output)
        summary = summaries[-1] if summaries else "no pytest summary line"
        retcodes = [command.get("retcode") for command in commands]
        ok = all(code == 0 for code in retcodes) and _count("passed", summary) > 0
        print(f"{'PASS' if ok else 'FAIL'} {name} ({_versions(name, env, work_dir)}): {summary}")
        failures += not ok
    print(f"tox: {len(expected) - failures} of {len(expected)} environments passed")
    return 1 if failures or not expected else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
