#!/bin/sh
# The real-GPU kit, from the repository root on the GPU machine (root, no network):
#   sh tools/real-gpu/run.sh [kit.py options]        on the node's driver
#   sh tools/real-gpu/run.sh --sim [kit.py options]  on the simulator: the kit's own check, here
# It installs gpuslice from the wheels prepare.sh fetched into a venv that sees
# this Python's packages (PyTorch, JAX, CuPy, ...), building the C parts, then
# runs kit.py: the context's cost measured, the CDI spec, the daemon on the
# driver, `gpuslice selftest`, and the frameworks in slices. One call fits in
# 9 minutes; steps done are kept under build/real-gpu, so calling again resumes.
# Reports go to $OUT (what the device tool brings back), else build/real-gpu/out.
set -eu
start=$(date +%s)
repo=$(cd "$(dirname "$0")/../.." && pwd -P)
kitdir=${GPUSLICE_KIT_STATE:-$repo/build/real-gpu}
out=${OUT:-$kitdir/out}
work=${GPUSLICE_KIT_DIR:-/tmp/gpuslice-kit}  # sockets: a short path
wheels=${WHEELS:-$repo/tools/real-gpu/wheels}
mkdir -p "$out" "$kitdir" "$work"
log() { echo "real-gpu: $*" | tee -a "$out/kit.log"; }
sim=""
[ "${1:-}" = "--sim" ] && sim=1

# what the install depends on: this script and the sources (the probes and the kit are read in place)
stamp=$(cd "$repo" && { cat tools/real-gpu/run.sh; find . \( -path ./build -o -path ./tools/real-gpu -o -path ./.git -o -path ./.venv \
        -o -name '*.egg-info' -o -name _native -o -name __pycache__ \) -prune -o -type f \
        \( -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.S' -o -name '*.def' -o -name '*.mk' \
        -o -name Makefile -o -name '*.toml' \) -print | LC_ALL=C sort | xargs cat; } | sha256sum | cut -c1-16)
stamp="$stamp${sim:+-sim}"
venv="$kitdir/venv"
py="$venv/bin/python"
if [ "$(cat "$venv/.gpuslice-stamp" 2>/dev/null)" != "$stamp" ]; then
    [ -d "$wheels" ] || { log "no $wheels: run tools/real-gpu/prepare.sh where there is network, and carry it"; exit 2; }
    log "installing gpuslice${sim:+ and the simulator} into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # python3 may itself be a venv (the GPU machine's is): --system-site-packages would see
    # the interpreter's base, not it. A .pth line per site directory of python3 sees what it has,
    # after what the kit installs.
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/zz-host-python.pth"
    "$py" -m pip install --quiet --no-index --find-links "$wheels" setuptools wheel >>"$out/kit.log" 2>&1
    extra=""
    [ -n "$sim" ] && extra="$repo/sim"
    # shellcheck disable=SC2086 # extra is one path or nothing
    "$py" -m pip install --quiet --no-index --find-links "$wheels" --no-build-isolation "$repo" cuda-bindings $extra \
        >>"$out/kit.log" 2>&1 || { log "pip install failed (kit.log)"; exit 2; }
    # py-spy: the stacks of a probe that does not answer (the kit does without it)
    "$py" -m pip install --quiet --no-index --find-links "$wheels" py-spy >>"$out/kit.log" 2>&1 ||
        log "no py-spy wheel: a probe that does not answer gets its Python stacks only"
    echo "$stamp" >"$venv/.gpuslice-stamp"
    log "installed in $(($(date +%s) - start)) s"
fi
# which gpuslice this is: this tree's own commit when it is a git checkout's root (not an
# enclosing repository's), else the one prepare.sh recorded beside the wheels
if [ "$(git -C "$repo" rev-parse --show-toplevel 2>/dev/null)" = "$repo" ]; then
    GPUSLICE_KIT_REV=$(git -C "$repo" describe --always --dirty --abbrev=12)
elif [ -f "$wheels/gpuslice-commit" ]; then
    GPUSLICE_KIT_REV="$(cat "$wheels/gpuslice-commit"), as prepared"
else
    GPUSLICE_KIT_REV="commit unknown"
fi
export GPUSLICE_KIT_REV
budget=$((540 - ($(date +%s) - start)))
rm -f "$work/rc"
{
    PYTHONUNBUFFERED=1 "$py" "$repo/tools/real-gpu/kit.py" --state "$kitdir/state" --out "$out" --work "$work" \
        --budget "$budget" "$@" 2>&1
    echo $? >"$work/rc"
} | tee -a "$out/kit.log"
exit "$(cat "$work/rc" 2>/dev/null || echo 2)"
