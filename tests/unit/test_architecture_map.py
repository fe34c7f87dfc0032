"""docs/architecture.md is the map: every top-level component of the
repository has a row in its Components table."""

from __future__ import annotations

import fnmatch
import re

from tests.harness import REPO


def ignored(name: str) -> bool:
    patterns = [p.strip().rstrip("/") for p in (REPO / ".gitignore").read_text().splitlines()]
    return any(p and not p.startswith("#") and fnmatch.fnmatch(name, p) for p in patterns)


def test_every_top_level_component_has_a_row_on_the_map():
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text.split("## Components", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([^`/]+)/` \|", table, re.M))
    components = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".") and not ignored(p.name)}
    assert len(components) >= 10, components  # the listing found the tree
    assert components - rows == set(), "components without a row in docs/architecture.md"
    assert rows - components == set(), "rows for directories that are gone"
