"""Pages a user can trust: every benchmark figure a page quotes is in the run it quotes, the
benchmark prints what the pages say it prints, every example is listed, the compatibility page
has a row for every environment of the matrix, and no page reads as an engineering log (that
record is CONTRIBUTING.md's)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
RUN = ROOT / "docs" / "benchmark.md"  # the run README.md and performance.md quote

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
COMMENT = re.compile(r"<!--.*?-->", re.S)
# A time or a ratio: "34.12 ms", "98 ms", "2.89x", "3.0x" (not "24 x Linear", not "0.3 MB").
FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)( ms\b|x\b)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def prose(text: str) -> str:
    """`text` without code blocks and HTML comments: what a page says in its own words."""
    return COMMENT.sub("", FENCE.sub("", text))


def without_section(text: str, heading: str) -> str:
    """`text` less the section that starts at `heading` (to the next heading of its level)."""
    if heading not in text:
        return text
    before, rest = text.split(heading, 1)
    level = heading.split(" ", 1)[0]
    after = re.split(rf"^{level} ", rest, maxsplit=1, flags=re.M)
    return before + (f"{level} " + after[1] if len(after) > 1 else "")


def user_part_of_the_readme() -> str:
    return README.read_text(encoding="utf-8").split("\n## Development", 1)[0]


def quoted_figures(text: str) -> List[str]:
    return [number + unit for number, unit in FIGURE.findall(prose(text))]


def the_runs_figures() -> Set[str]:
    """Every figure of the run, also as it reads rounded to fewer decimals ("34.1 ms", "2.9x")."""
    found: Set[str] = set()
    for number, unit in FIGURE.findall(RUN.read_text(encoding="utf-8")):
        value = float(number.replace(",", ""))
        decimals = len(number.split(".", 1)[1]) if "." in number else 0
        for places in range(decimals + 1):
            found.add(f"{value:,.{places}f}{unit}")
            found.add(f"{value:.{places}f}{unit}")
    return found


def pages_quoting_the_run() -> Iterable[Path]:
    return (README, PERFORMANCE)


@pytest.mark.parametrize("page", pages_quoting_the_run(), ids=lambda p: p.name)
def test_every_figure_a_page_quotes_is_in_the_run_it_quotes(page: Path) -> None:
    """README.md and docs/performance.md (less its GPU section, which quotes the GPU run's own
    table, docs/benchmark-cuda.md) quote one run: docs/benchmark.md.  When the benchmark is run
    again, this test lists every figure to update (CONTRIBUTING.md says where each is)."""
    text = user_part_of_the_readme() if page == README else without_section(
        page.read_text(encoding="utf-8"), "## On a GPU")
    run = the_runs_figures()
    missing = sorted({figure for figure in quoted_figures(text) if figure not in run})
    assert missing == [], f"{page.name} quotes figures that are not in docs/benchmark.md: {missing}"


@pytest.mark.parametrize("page", pages_quoting_the_run(), ids=lambda p: p.name)
def test_a_page_names_the_date_of_the_run_it_quotes_and_no_other(page: Path) -> None:
    generated = re.search(r"on (\d{4}-\d\d-\d\d) \d\d:\d\d UTC", RUN.read_text(encoding="utf-8"))
    assert generated is not None
    if page == README:
        text = prose(user_part_of_the_readme()).split("## Alternatives, and what they cost", 1)[1]
    else:
        text = prose(without_section(page.read_text(encoding="utf-8"), "## On a GPU"))
    dates = set(DATE.findall(text))
    assert dates == {generated.group(1)}, (page.name, dates)


def test_the_quick_benchmark_prints_what_the_pages_say(tmp_path: Path) -> None:
    """README.md and docs/performance.md say what a quick run's target lines start with; the
    quick run of the smallest model (a few seconds) prints exactly that.  The benchmark draws
    its plot with matplotlib, which the `bench` extra brings (the README's set-up installs it;
    tox's environments install only the `test` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed (pip install -e '.[dev]')")
    readme = " ".join(README.read_text(encoding="utf-8").split())
    said = re.search(r"its lines start with `(\w+)`", readme)
    performance = " ".join(PERFORMANCE.read_text(encoding="utf-8").split())
    assert said is not None and f"`{said.group(1)}`, judging nothing, in a quick run" in performance
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_copy.py"), "--quick",
                           "--only", "bare tensor", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    targets = [line for line in lines if "(target " in line]
    assert targets and all(line.startswith(f"{said.group(1)}  ") for line in targets), targets
    assert lines[-1].startswith("quick run: ") and "none judged" in lines[-1]


# Words of the engineering record: runs on the project's machine, plans, history. A user's page
# says what is true for users; the record is CONTRIBUTING.md's.
RECORD = [
    r"\bthis machine\b", r"\bour (experiments|machine|runs?)\b", r"\bin our\b", r"\bmeasured here\b",
    r"\bhere\)", r"\b[Rr]un history\b", r"\ba guess\b", r"\bthat day\b", r"\bfresh clone\b",
    r"\bthe project's (2-core )?machine\b", r"/work/", r"/root/", r"\bwt-\w+", r"\b[Ii]ssue \d+",
    r"`[0-9a-f]{7,40}`", r"\bThe plan\b", r"\bslower than earlier\b",
]
USER_PAGES = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "changelog.md"]


@pytest.mark.parametrize("page", [README, *USER_PAGES], ids=lambda p: p.name)
def test_no_page_of_the_user_reads_as_the_engineering_record(page: Path) -> None:
    text = prose(user_part_of_the_readme() if page == README else page.read_text(encoding="utf-8"))
    found = [(pattern, match.group(0)) for pattern in RECORD for match in re.finditer(pattern, text)]
    assert found == [], f"{page.name}: {found}"


def test_every_example_is_listed_and_the_readme_links_the_list() -> None:
    listed = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    for script in sorted((ROOT / "examples").glob("*.py")):
        assert f"`examples/{script.name}`" in listed, script.name
    assert "(docs/examples.md)" in user_part_of_the_readme()


def test_the_readme_gives_cpu_only_machines_their_set_up_and_keeps_ci_s_commands() -> None:
    """CI runs the two marked commands verbatim; the advice for a machine without a CUDA GPU
    comes beside them, in the Development section."""
    text = README.read_text(encoding="utf-8")
    assert ('<!-- setup-command -->\n<!-- doc-commands: skip (creates a fresh venv and installs torch '
            'and every extra, 70-170 s; .ci/run runs this command first) -->\n```bash\npython3 -m venv '
            '.venv && .venv/bin/python -m pip install "torch==2.13.0" -e ".[dev]"\n```\n') in text
    assert ("<!-- test-command -->\n```bash\n.venv/bin/python -m coverage run -m pytest && "
            ".venv/bin/python -m coverage report\n```\n") in text
    development = text.split("\n## Development", 1)[1].split("<!-- test-command -->", 1)[0]
    assert ('.venv/bin/python -m pip install "torch==2.13.0" --index-url '
            "https://download.pytorch.org/whl/cpu") in development


def _environments() -> List[str]:
    """tox.ini's env_list, braces expanded."""
    text = (ROOT / "tox.ini").read_text(encoding="utf-8")
    block = text.split("env_list =", 1)[1].split("\nlabels", 1)[0]
    names: List[str] = []
    for entry in block.split():
        braces = re.search(r"\{([^}]*)\}", entry)
        if braces is None:
            names.append(entry)
        else:
            head, tail = entry[:braces.start()], entry[braces.end():]
            names += [head + part + tail for part in braces.group(1).split(",")]
    return names


def test_the_compatibility_page_has_a_row_of_the_current_suite_for_every_environment() -> None:
    """The table the full matrix fills in: one row per environment (torch minor, wrapt,
    Python), each with a suite, a date and a result column."""
    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    table = page.split("## Results of the current suite", 1)[1].split("\n## ", 1)[0]
    rows = {tuple(cell.strip() for cell in line.strip().strip("|").split("|"))[:3]
            for line in table.splitlines() if line.startswith("| 2.")}
    assert "| torch | wrapt | Python | suite | date | result |" in table
    environments = _environments()
    assert len(environments) == 36
    for env in environments:
        found = re.match(r"^(?:py3(\d+)-)?torch2(\d+)(-wrapt1)?$", env)
        assert found is not None, env
        python = f"3.{found.group(1)}" if found.group(1) else "3.11"
        wrapt = "1.14.0" if found.group(3) else "2.x (newest)"
        assert (f"2.{found.group(2)}.x", wrapt, python) in rows, env
