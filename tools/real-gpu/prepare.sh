#!/bin/sh
# Run here, with network, before a session that has a GPU: the wheels the
# kit installs on the GPU machine (Python 3.12, no network), into
# tools/real-gpu/wheels (ignored by git; the device tool carries it: name it
# in `carry`). What the machine already has (PyTorch, JAX, CuPy, grpcio, ...)
# pip leaves alone there; these are what gpuslice itself needs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${WHEELS:-$here/wheels}
pyver=${PYVER:-3.12}  # the GPU machine's; another only to try the kit here (run.sh --sim)
abi=cp$(echo "$pyver" | tr -d .)
python=${PYTHON:-python3}
mkdir -p "$out"
# the node's runtime dependencies (pyproject.toml [project] dependencies), NVIDIA's
# driver-API client the probes use (the GPU machine has it; the simulator run needs it), and
# what building it there needs (setuptools, wheel: pip --no-build-isolation), and py-spy (the
# stacks of a probe that does not answer)
"$python" -m pip download --quiet --dest "$out" --python-version "$pyver" --implementation cp --abi "$abi" \
    --platform manylinux1_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 \
    --platform any --only-binary=:all: \
    'click>=8.1' 'pyyaml>=6.0' 'nvidia-ml-py>=12.535.77' 'grpcio>=1.85' 'grpcio-health-checking>=1.85' \
    'protobuf>=7.35' 'jsonschema>=4.20' 'prometheus-client>=0.20' 'cffi>=1.16' 'tomli-w>=1.0' \
    'cuda-bindings>=12.8' 'setuptools>=70' 'wheel' 'py-spy>=0.4'
# which gpuslice these wheels go with: the GPU machine gets a copy of the tree without .git
git -C "$here" describe --always --dirty --abbrev=12 >"$out/gpuslice-commit" 2>/dev/null || rm -f "$out/gpuslice-commit"
size=$(du -sm "$out" | cut -f1)
echo "$out: $(ls "$out" | wc -l) wheels, ${size} MiB"
if [ "$size" -gt 38 ]; then
    echo "prepare: the wheels are ${size} MiB; with the tree they must stay under 40 MiB" >&2
    exit 1
fi
