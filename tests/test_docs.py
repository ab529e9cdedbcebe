"""The README and the design document link only to files inside the repository."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS = ["README.md", "docs/design.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_links_stay_inside_the_repository(doc: str) -> None:
    path = REPO / doc
    targets = LINK.findall(path.read_text(encoding="utf-8"))
    assert targets, f"{doc} has no links: the pattern no longer matches"
    for target in targets:
        file = target.split("#", 1)[0]
        assert "://" not in target, f"{doc}: external link {target}"
        resolved = (path.parent / file).resolve()
        assert resolved.is_relative_to(REPO), f"{doc}: {target} points outside the repository"
        assert resolved.exists(), f"{doc}: {target} does not exist"


def test_readme_links_the_design() -> None:
    assert "](docs/design.md)" in (REPO / "README.md").read_text(encoding="utf-8")
