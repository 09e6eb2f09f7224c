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
from typing import Optional, Tuple

__all__ = [
    "TESTED_PYTHON", "TESTED_TORCH", "TESTED_WRAPT",
    "minor_of", "tested_range_text", "torch_newer_than_tested",
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
