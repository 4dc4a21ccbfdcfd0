"""The README is the front door: one screen, and every docs/ page one link away; links
between the pages land on a file and a heading that exist."""

from __future__ import annotations

import re

from helpers import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path) -> set[str]:
    out, fence = set(), False
    for line in path.read_text().splitlines():
        fence ^= line.startswith("```")
        if not fence and (m := re.match(r"^#+ (.*)", line)):
            out.add(anchor(m.group(1)))
    return out


def test_readme_is_one_screen_and_links_every_docs_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    linked = {m.group(1).split("#")[0] for m in LINK.finditer(text)}
    assert {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} <= linked


def test_relative_links_reach_a_file_and_heading():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for m in LINK.finditer(page.read_text()):
            target, _, frag = m.group(1).partition("#")
            if target.startswith(("http://", "https://")):
                continue
            path = (page.parent / target) if target else page
            if not path.exists():
                broken.append(f"{page.name}: {m.group(1)} (no file)")
            elif frag and path.suffix == ".md" and frag not in headings(path):
                broken.append(f"{page.name}: {m.group(1)} (no heading)")
    assert not broken, "\n".join(broken)
