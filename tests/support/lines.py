"""Finding a line by a marker comment, so that tests of warning locations need no arithmetic."""

from __future__ import annotations

from pathlib import Path


def marked_line(path: str, marker: str) -> int:
    """The number of the one line of ``path`` that ends with the comment ``# line: marker``."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    found = [n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# line: {marker}")]
    assert len(found) == 1, f"{path}: {len(found)} lines are marked {marker!r}"
    return found[0]
