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


def _benchmark_rows() -> Dict[str, List[str]]:
    """docs/benchmark.md's wall-time rows: "model | method" -> the cells after them."""
    text = (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8")
    wall = text.split("### Wall time", 1)[1].split("###", 1)[0]
    rows = {}
    for line in wall.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0] and not cells[0].startswith("---"):
            rows[f"{cells[0].split(' (')[0]} | {cells[1]}"] = cells[2:]
    return rows


def test_the_readmes_figures_are_the_generated_benchmarks() -> None:
    """One source for each figure: the README quotes docs/benchmark.md's run, and its date."""
    rows = _benchmark_rows()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Alternatives, and what they cost", 1)[1].split("## ", 1)[0]
    quoted = {
        "module-heavy | native deepcopy": "native deepcopy: {}",
        "module-heavy | state_dict -> fresh instance": "| {} |",
        "module-heavy | torch.save/load (BytesIO)": "| {} |",
        "module-heavy | shim silent": "**{}** (",
        "transformer non-leaf | state_dict -> fresh instance": "| {} |",
        "transformer non-leaf | torch.save/load (BytesIO)": "| {} |",
        "transformer non-leaf | shim silent": "**{}** |",
    }
    for row, shape in quoted.items():
        assert shape.format(rows[row][0]) in table, (row, rows[row][0])
    speedup = rows["module-heavy | shim silent"][1]
    assert f"({speedup} faster than native)" in table
    big = rows["big | shim silent"]
    assert f"`silent`: {big[2]} warm, {big[5]} cold in that run" in " ".join(table.split())
    generated = re.search(r"on (\d{4}-\d\d-\d\d \d\d:\d\d UTC)",
                          (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8"))
    assert generated is not None and generated.group(1) in " ".join(table.split())


def test_the_sample_output_of_a_bad_environment_value_is_todays() -> None:
    """docs/activation.md shows what `DEEPCOPY_SHIM=loud python -c ...` prints: it is run here."""
    import subprocess
    import sys

    from support.processes import clean_env

    text = (ROOT / "docs" / "activation.md").read_text(encoding="utf-8")
    block = text.split('$ DEEPCOPY_SHIM=loud python -c "print(\'training...\')"\n', 1)[1].split("```", 1)[0]
    proc = subprocess.run([sys.executable, "-c", "print('training...')"], capture_output=True,
                          text=True, env=clean_env("loud"), timeout=120)
    assert block.splitlines() == [*proc.stderr.splitlines(), *proc.stdout.splitlines()]


def test_the_count_of_cuda_tests_the_compatibility_page_gives_is_the_suites() -> None:
    import subprocess
    import sys

    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    said = re.search(r"`tests/test_cuda\.py`, (\d+) today", page)
    assert said is not None
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_cuda.py")], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    collected = re.search(r"(\d+) tests? collected", proc.stdout)
    assert collected is not None, proc.stdout + proc.stderr
    assert said.group(1) == collected.group(1)
