"""Every relative link between the README and docs/ resolves: the file exists, and a ``#section`` names a heading
of it (GitHub's anchors: lower case, punctuation dropped, spaces as dashes, a repeated heading numbered)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCED = re.compile(r"```.*?```", re.S)
HEADING = re.compile(r"^#{1,6}\s+(.*)$", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCED.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def broken_links(root: Path) -> list[str]:
    documents = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    sections = {d.resolve(): anchors(d.read_text()) for d in documents}
    broken = []
    for document in documents:
        for target in LINK.findall(FENCED.sub("", document.read_text())):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            path, _, fragment = target.partition("#")
            destination = (document.parent / path).resolve() if path else document.resolve()
            if not destination.exists():
                broken.append(f"{document.name}: {target} (no such file)")
            elif fragment and destination.suffix == ".md" and fragment not in sections.get(destination, set()):
                broken.append(f"{document.name}: {target} (no such section)")
    return broken


def test_every_link_between_the_readme_and_the_docs_resolves() -> None:
    assert broken_links(ROOT) == []


def test_a_missing_section_or_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Set-up, step by step\n\n## Set-up, step by step\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/guide.md#set-up-step-by-step) [second](docs/guide.md#set-up-step-by-step-1)\n"
        "[gone](docs/guide.md#setup) [none](docs/missing.md) [web](https://example.com/x.md)\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: docs/guide.md#setup (no such section)",
        "README.md: docs/missing.md (no such file)",
    ]
