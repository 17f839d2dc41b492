"""Every relative link of README.md and docs/*.md resolves (the file, and the #anchor to one of its headings,
slugged as GitHub does), and the README stays short enough for a newcomer to read."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200
MD = MarkdownIt("commonmark").enable("table")


def _text(inline) -> str:
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


@lru_cache(maxsize=None)
def anchors(path: Path) -> set[str]:
    """The #anchors GitHub gives the headings of a markdown file (lower case, punctuation dropped, spaces to
    hyphens, -1, -2 ... on repeats)."""
    tokens, seen, out = MD.parse(path.read_text(encoding="utf-8")), {}, set()
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            slug = re.sub(r"[^\w\- ]", "", _text(tokens[i + 1]).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Targets of the markdown links and images of a file (code spans and blocks excluded)."""
    out = []
    for tok in MD.parse(path.read_text(encoding="utf-8")):
        for child in tok.children or []:
            if child.type == "link_open":
                out.append(child.attrs["href"])
            elif child.type == "image":
                out.append(child.attrs["src"])
    return out


def broken_links(path: Path) -> list[str]:
    """'target: why' for every relative link of ``path`` that does not resolve."""
    out = []
    for target in links(path):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue
        dest = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not dest.exists():
            out.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif parts.fragment and dest.suffix == ".md" and parts.fragment not in anchors(dest):
            out.append(f"{target}: no heading with anchor #{parts.fragment} in {dest.name}")
    return out


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    bad = broken_links(path)
    assert not bad, f"{path.relative_to(ROOT)}: {len(bad)} broken link(s): {bad}"


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; allowed: <= {README_MAX_LINES} (measured results go " \
                                  f"to docs/results.md)"


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with `code`\n\n## A heading, with `code`\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-heading-with-code) [ok too](other.md#a-heading-with-code-1) [web](https://x.y/z)\n"
                   "[gone](missing.md) [bad anchor](other.md#nowhere) ![img](fig.png)\n\n`[not a link](nope.md)`\n")
    bad = broken_links(doc)
    assert [b.split(":")[0] for b in bad] == ["missing.md", "other.md#nowhere", "fig.png"], bad
