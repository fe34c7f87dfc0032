#!/bin/sh
# The real-GPU kit, stage 1, run on the GPU machine from the repository root:
#   sh tools/real-gpu/run.sh            # the node's driver (nvml: driver)
#   sh tools/real-gpu/run.sh --sim      # here, on the simulator: the kit's own check
# It installs gpuslice into a venv that sees the machine's packages (PyTorch,
# JAX, ...) from the wheels prepare.sh fetched (no network), builds the C parts,
# writes the CDI spec from the driver's files, starts the daemon and runs
# `gpuslice selftest --json`. Results go to $OUT (the device tool's folder that
# comes back), else build/real-gpu.
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$repo/build/real-gpu}
work=${GPUSLICE_KIT_DIR:-/tmp/gpuslice-kit}
driver=nvidia
[ "${1:-}" = "--sim" ] && driver=sim
mkdir -p "$out" "$work"
log() { echo "real-gpu: $*" | tee -a "$out/kit.log"; }

log "installing gpuslice ($driver) into $work/venv"
python3 -m venv --system-site-packages "$work/venv"
py="$work/venv/bin/python"
wheels=${WHEELS:-$repo/tools/real-gpu/wheels}
[ -d "$wheels" ] || { log "no $wheels: run tools/real-gpu/prepare.sh where there is network, and carry it"; exit 2; }
"$py" -m pip install --quiet --no-index --find-links "$wheels" setuptools wheel >>"$out/kit.log" 2>&1
extra=""
[ "$driver" = sim ] && extra="$repo/sim"
# shellcheck disable=SC2086 # extra is one path or nothing
"$py" -m pip install --quiet --no-index --find-links "$wheels" --no-build-isolation "$repo" $extra \
    >>"$out/kit.log" 2>&1 || { log "pip install failed (kit.log)"; exit 1; }
gs="$work/venv/bin/gpuslice"
hook=$("$py" -c 'from gpuslice.paths import built_executable; print(built_executable("gpuslice-hook"))')

cfg="$work/daemon.yaml"
{
    echo "socket: $work/gpuslice.sock"
    echo "slice_socket: $work/slice/slice.sock"
    echo "state_dir: $work/state"
    echo "slice_files_dir: $work/slices"
    echo "metrics: {port: 0}"
    if [ "$driver" = sim ]; then
        echo "nvml: sim"
        echo "sim: {config: $work/sim.yaml, state_dir: $work/sim}"
    else
        echo "nvml: driver"
    fi
} >"$cfg"
spec="$work/cdi/gpuslice.json"
simargs=""
if [ "$driver" = sim ]; then
    printf 'gpus:\n  - {memory: 16Gi}\n' >"$work/sim.yaml"
    mkdir -p "$work/sim"
    simargs="--sim-config $work/sim.yaml --sim-state-dir $work/sim"
    eval "$("$gs" sim env --config "$work/sim.yaml" --state-dir "$work/sim" 2>/dev/null || true)"
fi
# shellcheck disable=SC2086
"$gs" cdi generate --driver "$driver" --output "$spec" --hook "$hook" --daemon-socket "$work/gpuslice.sock" \
    --slice-dir "$work/slice" $simargs >>"$out/kit.log" 2>&1 || { log "cdi generate failed (kit.log)"; exit 1; }
cp "$spec" "$out/cdi-spec.json"

"$gs" daemon --config "$cfg" >"$out/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null' EXIT INT TERM
i=0
until [ -S "$work/gpuslice.sock" ]; do
    i=$((i + 1))
    [ $i -gt 300 ] && { log "the daemon did not start (daemon.log)"; exit 1; }
    kill -0 $daemon 2>/dev/null || { log "the daemon exited (daemon.log)"; exit 1; }
    sleep 0.1
done
log "daemon up; selftest"
rc=0
"$gs" selftest --config "$cfg" --cdi-spec "$spec" --json >"$out/selftest.json" 2>>"$out/kit.log" || rc=$?
"$py" - "$out/selftest.json" <<'PY' | tee -a "$out/kit.log"
import json, sys
rows = json.load(open(sys.argv[1]))["checks"]
bad = [c for c in rows if c["verdict"] == "FAIL"]
print(f"selftest: {len(rows)} checks, {len(bad)} failed")
for c in bad:
    print(f"  FAIL {c['name']}: expected {c['expected']}, observed {c['observed']}")
PY
log "selftest exit status $rc"
exit $rc
