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


def _rows(page: str) -> Dict[str, List[str]]:
    """A generated benchmark table's wall-time rows: "model | method" -> the cells after them."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    wall = text.split("### Wall time", 1)[1].split("###", 1)[0]
    rows = {}
    for line in wall.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 3 and cells[0] and not cells[0].startswith("---"):
            rows[f"{cells[0].split(' (')[0]} | {cells[1]}"] = cells[2:]
    return rows


def test_the_readmes_figures_are_the_generated_benchmarks() -> None:
    """One source for each figure: the README quotes docs/benchmark.md's run, and its date."""
    rows = _rows("benchmark.md")
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


SEE_EVERY = 'warnings.simplefilter("always", deepcopy_shim.DetachedTensorsWarning)'
COPIES_IN_A_LOOP = """\
import copy, warnings
import torch, torch.nn as nn
import deepcopy_shim
{see_every}
model = nn.Linear(2, 2)
model.out = model(torch.ones(1, 2))
deepcopy_shim.enable()
for _ in range(3):
    copy.deepcopy(model)
"""


def test_one_warning_per_line_under_pythons_default_filter_and_the_way_to_see_every_one() -> None:
    """README and getting-started: the same copy made again by the same line warns once under
    the default filter; the line they give, or `-W "always:deepcopy_shim"`, shows every one."""
    import subprocess
    import sys

    from support.processes import clean_env

    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text(encoding="utf-8")
        assert f"import warnings\n{SEE_EVERY}\n" in text, page.name
        assert '`python -W "always:deepcopy_shim" train.py`' in text, page.name
        assert "once per line of your code" in " ".join(text.split()), page.name
    env = {k: v for k, v in clean_env().items() if k != "PYTHONWARNINGS"}

    def shown(*options: str, see_every: str = "") -> int:
        proc = subprocess.run([sys.executable, *options, "-c", COPIES_IN_A_LOOP.format(see_every=see_every)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr.count("DetachedTensorsWarning: deepcopy_shim: deep copy of a Linear")

    assert shown() == 1
    assert shown(see_every=SEE_EVERY) == 3
    assert shown("-W", "always:deepcopy_shim") == 3


FINDS_WITHOUT_COPYING = """\
import torch, torch.nn as nn
import deepcopy_shim

def resident(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field)) / 1024

def extra_peak(call):
    with open("/proc/self/clear_refs", "w") as clear:  # the high-water mark starts again here
        clear.write("5")
    before = resident("VmRSS:")
    kept = call()
    return resident("VmHWM:") - before

model = nn.Linear(2, 2)
model.cached = torch.ones(50_000_000, requires_grad=True) * 2  # 200 MB with autograd history
deepcopy_shim.find_nonleaf_tensors(model)  # once first: what it imports is not what it copies
found = extra_peak(lambda: deepcopy_shim.find_nonleaf_tensors(model))
copied = extra_peak(lambda: deepcopy_shim.deepcopy(model, "silent"))
print(round(found, 1), round(copied, 1))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux's /proc high-water mark")
def test_find_nonleaf_tensors_copies_no_tensor_data_as_getting_started_says() -> None:
    import subprocess
    import sys

    from support.processes import clean_env

    text = " ".join((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
    assert "To list them without copying any tensor data" in text
    proc = subprocess.run([sys.executable, "-c", FINDS_WITHOUT_COPYING], capture_output=True, text=True,
                          env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    found, copied = map(float, proc.stdout.split())
    assert copied > 150, proc.stdout  # the measure sees a copy of the data (200 MB: 191 MiB)
    assert found < 20, proc.stdout  # and the list copies none of it


def _section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_the_performance_page_is_a_users_page_and_the_record_is_in_contributing() -> None:
    """No issue numbers or commit hashes on the user's page; the engineering record moved to
    CONTRIBUTING.md with its commits, its runs and the first GPU run."""
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert not re.findall(r"[Ii]ssue \d+|\(issue|`[0-9a-f]{7,40}`", page)
    record = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8").split(
        "## Performance: the engineering record", 1)[1]
    for fact in ("### The full benchmark's targets", "### Issue 18's goals, measured",
                 "`243d0cb`", "`3c06594`", "`80a65ab`", "benchmarks/unchecked_module.patch",
                 "### The memo idiom (issue 12)", "### No more than native (issue 26)",
                 "### The first GPU run (2026-12-04)", "19 of 26 held",
                 "146 ms and +387 MB"):
        assert fact in record, fact


def test_the_performance_pages_figures_are_the_generated_benchmarks() -> None:
    """The CPU summary quotes docs/benchmark.md's run; the GPU section quotes the run that wrote
    docs/benchmark-cuda.md (its machine, date and rows), one source for each figure."""
    cpu = _rows("benchmark.md")
    summary = " ".join(_section("performance.md", "# Performance").split())
    shim, native = cpu["module-heavy | shim silent"], cpu["module-heavy | native deepcopy"]
    copium = cpu["module-heavy | copium.deepcopy"]
    for ms in (shim[0], native[0], copium[0]):  # quoted to one decimal: 13.6 ms for 13.57 ms
        assert f"{float(ms.split()[0]):.1f} ms" in summary, ms
    big = cpu["big | shim silent"]
    assert f"{big[2]} the time of the bare memory copy ({big[5]} on fresh pages)" in summary

    gpu_page = (ROOT / "docs" / "benchmark-cuda.md").read_text(encoding="utf-8")
    gpu = _rows("benchmark-cuda.md")
    section = _section("performance.md", "## On a GPU")
    flat = " ".join(section.split())
    date = re.search(r" on (\d{4}-\d\d-\d\d) ", gpu_page)
    assert date is not None and f"Measured on {date.group(1)} on one NVIDIA H200" in flat
    for field in ("Python", "torch"):
        said = re.search(rf"^- {field}: (\S+)$", gpu_page, re.M)
        assert said is not None and f"{field} {said.group(1)}" in flat, field
    assert "- GPU: NVIDIA H200" in gpu_page
    quoted = 0
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[1].endswith(("ms", "fails")):
            continue
        model = cells[0].split(" (")[0]
        native_row, shim_row = gpu[f"{model} | native deepcopy"], gpu[f"{model} | shim silent"]
        native_said = "fails" if native_row[0].startswith("fails") else native_row[0]
        assert cells[1:3] == [native_said, shim_row[0]], line
        assert cells[3] == shim_row[1] and cells[4] == shim_row[2], line
        assert shim_row[3].startswith(cells[5]), line
        quoted += 1
    assert quoted == 7
    cpu_after = cpu["module-heavy after compile | shim silent"][1]
    assert f"module-heavy {shim[1]} native before, {cpu_after} after" in flat
    assert "benchmarks/bench_copy.py --device cuda" in section and "benchmarks/gpu_check.sh" in section


# Characters of a code line the rendered site shows at a 1280 px window before it scrolls (about
# 84 with mkdocs-material's default fonts); blocks of output (```text) wrap instead.
CODE_WIDTH = 82


def _code_lines(page: Path) -> List[str]:
    long: List[str] = []
    language = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            language = None if language is not None else (line[3:].strip() or "text")
            continue
        if language not in (None, "text", "mermaid") and len(line) > CODE_WIDTH:
            long.append(f"{page.name}:{number}: {len(line)} characters")
    return long


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_code_lines_fit_the_page(page: Path) -> None:
    """A code block's line longer than the page is cut off at 1280 px: every one fits."""
    assert _code_lines(page) == []
