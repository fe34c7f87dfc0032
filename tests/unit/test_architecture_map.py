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


def test_every_file_the_map_names_is_in_the_tree():
    """A file named on the map (`allocator/compute.py`, `wrap/gate.c`, `templates/validate.yaml`) is a
    tracked file's path or the end of one: the map says where things are, and a move must move it too."""
    import subprocess

    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True).stdout.split()
    assert len(tracked) > 100, "not a git checkout's tree"
    text = (REPO / "docs" / "architecture.md").read_text()
    found = re.findall(r"`([\w./-]+\.(?:py|c|h|S|mk|md|yaml|def|proto|sh))`", text)
    named = {n for n in found if not n.startswith("../")}  # beside the project (shared/), not in it
    assert len(named) > 50, named  # the map names files: the pattern found them
    missing = sorted(n for n in named if not any(t == n or t.endswith("/" + n) for t in tracked))
    assert missing == [], f"docs/architecture.md names files the tree does not have: {missing}"


def test_the_owner_kinds_the_map_names_are_the_stores_and_the_wires():
    """The map lists the owner kinds; they are records.OwnerKind's and the proto's enum's, one for one."""
    from gpuslice.allocator.records import OwnerKind
    from gpuslice.proto import gpuslice_pb2 as pb

    text = (REPO / "docs" / "architecture.md").read_text()
    said = re.search(r"`records\.OwnerKind`:\s*([A-Z_,\s]+?);", text)
    assert said, "docs/architecture.md: the owner kinds' list after `records.OwnerKind`:"
    named = {n.strip() for n in said.group(1).split(",")}
    assert named == {k.name for k in OwnerKind}
    assert named == set(pb.OwnerKind.keys()) - {"OWNER_KIND_UNSPECIFIED"}
