"""The documentation's links resolve: every relative link in README.md, docs/ and the
examples' READMEs names a file that exists, and every ``#anchor`` a heading of that page
(slugged as MkDocs and GitHub slug them). The index links every page."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("examples/*/README.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines():
        match = FENCE.match(line)
        if match and (fence is None or match.group(1).startswith(fence)):
            fence = None if fence else match.group(1)
            continue
        if fence is None:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """python-markdown's toc slugify (what MkDocs uses), with backticks dropped."""
    value = unicodedata.normalize("NFKD", heading.replace("`", ""))
    value = value.encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def anchors(page: Path) -> set[str]:
    return {
        slug(m.group(1))
        for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", _prose(page.read_text()), re.M)
    }


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken: list[str] = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, broken


def test_the_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    linked = {t.partition("#")[0] for t in LINK.findall(index)}
    missing = sorted(
        p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked
    )
    assert not missing, f"add to docs/README.md (the index) and mkdocs.yml's nav: {missing}"


def test_slug_matches_mkdocs() -> None:
    assert slug("Sub-jobs: `SubJobEnqueuer` (`ctx.jobs`)") == "sub-jobs-subjobenqueuer-ctxjobs"
    assert slug("Deduplication: `unique_for`, `idempotency_key` or `singleton`") == (
        "deduplication-unique_for-idempotency_key-or-singleton"
    )
