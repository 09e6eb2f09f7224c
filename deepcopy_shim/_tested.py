"""What deepcopy-shim was tested with, and how a version string compares with it.

The package metadata does not cap torch or Python: what the shim relies on in torch is checked
where it is used (a self-check of torch's refusal at install time, see _patch; torch's own
`Tensor.__deepcopy__` copies every tensor first), so a newer release that changed it leaves the
shim inert rather than wrong.  These ranges say what the compatibility matrix proves
(docs/compatibility.md); a newer torch gets a one-time note in mode `warn` and a line in
`python -m deepcopy_shim --check`.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

__all__ = [
    "TESTED_PYTHON", "TESTED_TORCH", "TESTED_WRAPT",
    "excluded_versions", "minor_of", "reinstall_command", "requirement_of", "tested_range_text",
    "torch_newer_than_tested",
]

# (oldest, newest) minor release of each, as the tox matrix runs them.
TESTED_TORCH = ((2, 0), (2, 15))
TESTED_PYTHON = ((3, 9), (3, 13))
TESTED_WRAPT = ((1, 14), (2, 5))  # tox.ini: wrapt1 pins 1.14.0, the others get the newest 2.x (2.5.2)


def minor_of(version: str) -> Optional[Tuple[int, int]]:
    """`(2, 13)` for `"2.13.0+cpu"` or `"2.16.0a0+git1234"`; None if unreadable."""
    found = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def torch_newer_than_tested(version: str) -> bool:
    minor = minor_of(version)
    return minor is not None and minor > TESTED_TORCH[1]


def tested_range_text(which: Tuple[Tuple[int, int], Tuple[int, int]]) -> str:
    (a, b), (c, d) = which
    return f"{a}.{b}-{c}.{d}"


# What deepcopy-shim requires of a package is in its installed metadata (pyproject.toml's
# dependencies): read there, never written again here.
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*\(?([^;)]*)")


def requirement_of(name: str) -> Optional[str]:
    """deepcopy-shim's requirement of the package `name` (`wrapt>=1.14,!=2.2.0`), from its
    installed metadata; None where that metadata is not there (a source tree on sys.path)."""
    from importlib.metadata import PackageNotFoundError, requires  # imported when asked: start-up stays light

    try:
        requirements = requires("deepcopy-shim") or []
    except PackageNotFoundError:
        return None
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match and match.group(1).lower() == name and "extra ==" not in requirement:
            return f"{match.group(1)}{match.group(2).strip()}"
    return None


def excluded_versions(name: str) -> Tuple[str, ...]:
    """The versions of `name` that deepcopy-shim's requirement excludes (`!=`: releases with a
    known regression); () where there is none or the metadata is not there."""
    requirement = requirement_of(name) or ""
    found: List[str] = []
    for spec in requirement[len(name):].split(","):
        if spec.strip().startswith("!="):
            found.append(spec.strip()[2:].strip())
    return tuple(found)


def reinstall_command(name: str) -> str:
    """The command that reinstalls `name` as deepcopy-shim requires it."""
    return f'pip install --force-reinstall "{requirement_of(name) or name}"'
