#!/usr/bin/env bash
# mypy over the shipped Python (gpuslice/, cdi/, allocator/, dra/, device_plugin/, cli/, sim/gpuslice_sim) as the one
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
ln -s "$PWD/cdi" "$view/gpuslice/cdi"
ln -s "$PWD/allocator" "$view/gpuslice/allocator"
ln -s "$PWD/dra" "$view/gpuslice/dra"
ln -s "$PWD/device_plugin" "$view/gpuslice/device_plugin"
ln -s "$PWD/cli" "$view/gpuslice/cli"
ln -s "$PWD/sim/gpuslice_sim" "$view/gpuslice_sim"
cd "$view"
exec "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p gpuslice -p gpuslice_sim
