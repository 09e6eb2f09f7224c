"""Every ```python block in README.md and docs/ runs, so the documentation cannot rot."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> List[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_code_blocks_run(page: Path) -> None:
    """The blocks of one page run in order in one namespace, as a reader would paste them."""
    namespace: Dict[str, Any] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # examples in mode "warn" warn by design
        for number, source in enumerate(blocks(page), 1):
            code = compile(source, f"{page.name}[block {number}]", "exec")
            exec(code, namespace)


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name in nav, f"{page.name} is not listed in mkdocs.yml"
