"""Imports flow one way (DESIGN.md, Components): the core (gpuslice/) <- cdi/ <-
allocator/ <- cluster integrations <- cli/ (the composition root).  Every
import of a shipped module is read from its source (top level and inside
functions), so an upward one fails here, lazy or not."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from tests.harness import REPO
from tools.package_layout import package_dirs

# each import name's layer: a module may import only from its own layer or lower ones
LAYERS = {"gpuslice": 0, "gpuslice.cdi": 1, "gpuslice.allocator": 2, "gpuslice.dra": 3, "gpuslice.device_plugin": 3,
          "gpuslice.admission": 3, "gpuslice.cli": 4}  # fmt: skip
# each component's directory (pyproject's package-dir, the one source), its import name and layer
COMPONENTS = {directory: (name, LAYERS[name]) for name, directory in package_dirs().items()}


def layer_of(module: str) -> tuple[str, int] | None:
    """(component directory, layer) of an import name of ours; None for others'."""
    if module != "gpuslice" and not module.startswith("gpuslice."):
        return None
    best = ("gpuslice", 0)
    for directory, (name, layer) in COMPONENTS.items():
        if (module == name or module.startswith(name + ".")) and len(name) > len(COMPONENTS[best[0]][0]):
            best = (directory, layer)
    return best


def imports(path: Path, directory: str) -> list[tuple[int, str]]:
    """(line, module) of every import in a file of a component, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = COMPONENTS.get(directory, ("gpuslice", 0))[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[: len(package.split(".")) - node.level + 1], base]).rstrip(".")
            found += [(node.lineno, f"{base}.{a.name}" if base == "gpuslice" else base) for a in node.names]
    return found


def upward_imports(root: Path = REPO) -> list[str]:
    problems = []
    for directory, (_, layer) in COMPONENTS.items():
        for path in sorted((root / directory).rglob("*.py")):
            if "_pb2" in path.name or "_native" in path.parts:
                continue
            for line, module in imports(path, directory):
                target = layer_of(module)
                if target and target[1] > layer:
                    problems.append(f"{path.relative_to(root)}:{line}: {directory}/ imports {module} ({target[0]}/)")
    return problems


def test_no_component_imports_upward():
    assert upward_imports() == []


@pytest.mark.parametrize(
    ("where", "line"),
    [
        ("gpuslice/units.py", "from gpuslice.allocator import slices"),  # core -> daemon
        ("gpuslice/request.py", "    from gpuslice.cdi import spec"),  # core -> cdi, lazily in a function
        ("cdi/spec.py", "import gpuslice.allocator.store"),  # cdi -> daemon
        ("allocator/slices.py", "from gpuslice.cli.main import main"),  # daemon -> the command line
        ("allocator/slices.py", "from gpuslice import cli"),
    ],
)
def test_an_upward_import_is_caught(tmp_path, where, line):
    for directory in COMPONENTS:
        if (REPO / directory).is_dir():
            shutil.copytree(
                REPO / directory, tmp_path / directory, ignore=shutil.ignore_patterns("__pycache__", "_native")
            )
    assert upward_imports(tmp_path) == []
    body = f"\n\ndef _added() -> None:\n{line}\n" if line.startswith(" ") else f"\n{line}\n"
    with (tmp_path / where).open("a") as f:
        f.write(body)
    [problem] = upward_imports(tmp_path)
    assert problem.startswith(f"{where}:")


def simulator_imports_of_ours(root: Path = REPO) -> list[str]:
    """gpuslice-sim stands alone (a package of its own, installed without
    gpuslice too): any import of gpuslice in it is a problem."""
    return [
        f"{path.relative_to(root)}:{line}: sim/ imports {module}"
        for path in sorted((root / "sim").rglob("*.py"))
        if not {"_native", "build"} & set(path.relative_to(root).parts)
        for line, module in imports(path, "sim")
        if layer_of(module)
    ]


def test_the_simulator_imports_nothing_of_gpuslice(tmp_path):
    assert sorted(p.name for p in (REPO / "sim").rglob("*.py") if not {"_native", "build"} & set(p.parts)) == [
        "__init__.py",
        "setup.py",
    ]
    assert simulator_imports_of_ours() == []
    shutil.copytree(REPO / "sim", tmp_path / "sim", ignore=shutil.ignore_patterns("__pycache__", "_native"))
    with (tmp_path / "sim/gpuslice_sim/__init__.py").open("a") as f:
        f.write("\nfrom gpuslice import units\n")
    [problem] = simulator_imports_of_ours(tmp_path)
    assert problem.startswith("sim/gpuslice_sim/__init__.py:")


def test_bench_and_tools_do_not_import_the_tests():
    """The tests' harness is theirs: what the bench shares with them lives in tools/."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {module}"
        for directory in ("bench", "tools")
        for path in sorted((REPO / directory).rglob("*.py"))
        for line, module in imports(path, directory)
        if module == "tests" or module.startswith("tests.")
    ]
    assert sorted(p.name for p in (REPO / "tools").glob("*.py"))  # the listing found the tree
    assert found == []


def test_every_installed_component_has_a_layer_and_nothing_else_does():
    """The layers name the packages pyproject's package-dir installs, no more, no fewer."""
    assert set(LAYERS) == set(package_dirs())
