"""Every relative link in the repository's Markdown leads somewhere: the file exists and, where the
link names a heading, the heading exists (GitHub's anchor rule). The docs cite results folders,
tables and each other by link, and pages get split and moved."""

import functools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("docs", "examples", "repro", "te_async", "tests", "tools")  # not build/ or .venv/: other projects' pages
PAGES = [ROOT / "README.md"] + sorted(p for folder in SOURCES for p in (ROOT / folder).rglob("*.md"))
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def _text(page: pathlib.Path) -> str:
    return CODE.sub("", page.read_text())


@functools.cache  # a page is the target of many links
def _anchors(page: pathlib.Path) -> frozenset[str]:
    headings = re.findall(r"^#+ (.*)$", _text(page), re.M)
    return frozenset(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings)


def test_relative_links_resolve():
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "benchmarks.md" in PAGES
    broken = []
    for page in PAGES:
        for link in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
            if re.match(r"^[a-z]+:", link):
                continue
            target, _, heading = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}: no such file")
            elif heading and path.suffix == ".md" and heading not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {link}: no such heading")
    assert not broken, broken
