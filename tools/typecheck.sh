#!/usr/bin/env bash
# mypy over the shipped Python (the component directories and sim/gpuslice_sim) as the one
# package they install as: the component directories are mapped into gpuslice
# (pyproject package-dir), so mypy reads them through a tree of links laid out
# the way they are installed.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
mkdir "$view/gpuslice"
for f in gpuslice/*; do
    case "$(basename "$f")" in _native|__pycache__) continue ;; esac
    ln -s "$PWD/$f" "$view/gpuslice/"
done
# each component directory where pyproject's package-dir installs it (tools/package_layout.py)
while read -r name dir; do
    [ "$name" = gpuslice ] || ln -s "$PWD/$dir" "$view/gpuslice/${name#gpuslice.}"
done < <(.venv/bin/python tools/package_layout.py)
ln -s "$PWD/sim/gpuslice_sim" "$view/gpuslice_sim"
cd "$view"
exec "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p gpuslice -p gpuslice_sim
