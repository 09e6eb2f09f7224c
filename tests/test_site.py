"""The rendered documentation site reads as prose: no raw reST left over, no dead home links.

The site is built once (``mkdocs build --strict``, into a temporary directory) and every HTML page
is read as a browser would show it.  The prose is each page's article (not the navigation); text
inside ``<pre>``/``<code>`` (code blocks and inline code), scripts and styles is left out, and so
are URLs; what remains must not contain

* a raw Sphinx role (``:func:``, ``:meth:``, ``:class:``, ``:attr:``, ``:mod:``, ``:exc:``), which
  mkdocstrings prints as is when a docstring uses one;
* a literal ``::`` (reST's marker for a literal block), which Markdown prints as is;

and no page may link to ``github.com/deepcopy-shim``: there is no such repository.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROLE = re.compile(r":(func|meth|class|attr|mod|exc):")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I)
MISSING_HOME = "github.com/deepcopy-shim"
HIDDEN = {"pre", "code", "script", "style", "kbd", "samp"}


class _Page(HTMLParser):
    """Collects a page's prose, one string per text node, and every link target.

    Prose is the text of the page's ``<article>``: the navigation and the table of contents repeat
    its headings with their inline code flattened to text, so they are left out."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hidden = 0
        self.article = 0
        self.prose: List[str] = []  # the article's text outside code, URLs blanked
        self.text: List[str] = []  # every text node, code included, as written
        self.links: List[str] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag in HIDDEN:
            self.hidden += 1
        if tag == "article":
            self.article += 1
        for name, value in attrs:
            if name in ("href", "src", "action") and value:
                self.links.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag in HIDDEN and self.hidden:
            self.hidden -= 1
        if tag == "article" and self.article:
            self.article -= 1

    def handle_data(self, data: str) -> None:
        if not data.strip():
            return
        self.text.append(data)
        if self.article and not self.hidden:
            self.prose.append(URL.sub(" ", data))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site's directory, built once."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.fixture(scope="module")
def site(built: Path) -> Dict[str, _Page]:
    pages: Dict[str, _Page] = {}
    for html in sorted(built.rglob("*.html")):
        page = _Page()
        page.feed(html.read_text(encoding="utf-8"))
        page.close()
        pages[str(html.relative_to(built))] = page
    assert "index.html" in pages and "api/index.html" in pages, sorted(pages)
    return pages


def _offending(site: Dict[str, _Page], pattern: re.Pattern[str]) -> List[str]:
    found = []
    for name, page in site.items():
        for text in page.prose:
            for match in pattern.finditer(text):
                start = max(0, match.start() - 50)
                found.append(f"{name}: ...{' '.join(text[start:match.end() + 50].split())}...")
    return found


def test_no_raw_sphinx_roles(site: Dict[str, _Page]) -> None:
    found = _offending(site, ROLE)
    assert not found, f"{len(found)} raw Sphinx roles in the rendered site:\n" + "\n".join(found[:40])


def test_no_literal_double_colon_in_prose(site: Dict[str, _Page]) -> None:
    found = _offending(site, re.compile(r"::"))
    assert not found, f"{len(found)} literal '::' in the rendered prose:\n" + "\n".join(found[:40])


def test_no_link_to_a_repository_that_does_not_exist(site: Dict[str, _Page]) -> None:
    found = [
        f"{name}: {link}" for name, page in site.items() for link in page.links if MISSING_HOME in link
    ]
    found += [f"{name}: {text.strip()[:120]}" for name, page in site.items()
              for text in page.text if MISSING_HOME in text]
    assert not found, "\n".join(found)


def test_output_blocks_wrap_and_code_blocks_keep_their_lines(built: Path) -> None:
    """A block of output (```text: torch's refusal, a traceback) wraps at the page's width; code
    keeps its lines.  The stylesheet picks the blocks by the language class each one carries."""
    css = (built / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = re.search(r"\.md-typeset \.language-text pre > code \{([^}]*)\}", css)
    assert rule is not None and "white-space: pre-wrap" in rule.group(1), css
    assert css.count("{") == 1  # that one rule: code blocks scroll, as the theme has them
    blocks = 0
    for html in sorted(built.rglob("*.html")):
        text = html.read_text(encoding="utf-8")
        assert "stylesheets/extra.css" in text, html
        for classes in re.findall(r'<div class="([^"]*\bhighlight\b[^"]*)"', text):
            assert re.search(r"\blanguage-\w+", classes), f"{html}: a block without its language"
            blocks += "language-text" in classes
    assert blocks >= 10  # torch's refusal on the home page, the real outputs of the modes...
