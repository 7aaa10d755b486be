"""Every relative link in README.md, CHANGELOG.md and docs/ leads somewhere: to a file that
exists and, with a `#fragment`, to a heading of that file (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # no code "headings"
    return {anchor(h) for h in _HEADING.findall(text)}


def test_anchors_are_what_github_makes() -> None:
    assert anchor("PostgreSQL failover") == "postgresql-failover"
    assert (
        anchor("Consumer: the service against `COPY`, 2x") == "consumer-the-service-against-copy-2x"
    )


def test_every_relative_link_leads_to_a_file_and_heading_that_exist() -> None:
    documents = [
        _ROOT / "README.md",
        _ROOT / "CHANGELOG.md",
        *sorted((_ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for document in documents:
        for target in _LINK.findall(document.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # a URL, mailto:
            path, _, fragment = target.partition("#")
            linked = (document.parent / path) if path else document
            if not linked.exists():
                broken.append(f"{document.name}: {target} (no such file)")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
                broken.append(f"{document.name}: {target} (no such heading)")
    assert broken == []
