#!/bin/sh
# The calls docs/real-gpu.md plans for a lent GPU ("When a GPU is lent"), chained: a machine
# goes back 30 s after a device command, so each part is one command of at most 600 s.
#   sh tools/real-gpu/plan.sh first        calls 1 and 2: the selftest, the trace and shares,
#                                          then shares again with the fit's even base
#   sh tools/real-gpu/plan.sh rest SECONDS calls 3 and 4 within SECONDS (what `status` leaves,
#                                          less a margin): share-bias, lend, transformers, cost,
#                                          nvml-view, then mps and the framework steps
# GPUSLICE_KIT_STATE must be outside the carried tree (/tmp/kit), as for run.sh; the report of
# every call so far is in $OUT after each part.
set -eu
here=$(cd "$(dirname "$0")" && pwd -P)
: "${GPUSLICE_KIT_STATE:?set GPUSLICE_KIT_STATE=/tmp/kit: the calls resume from it}"
export GPUSLICE_KIT_STATE
call() { # the next call runs whatever this one's exit (1: a check failed, 3: steps left)
    sh "$here/run.sh" "$@" && return 0
    echo "plan.sh: the call exited $?"
}
case "${1:-}" in
first)
    call --budget 360 --only selftest --only trace --only shares
    call --budget 180 --again --only shares --daemon compute_fit_base=even
    ;;
rest)
    total=${2:?SECONDS: what is left of the device time for this command, at most 590}
    [ "$total" -ge 120 ] && [ "$total" -le 590 ] || { echo "plan.sh rest: SECONDS from 120 to 590, got $total" >&2; exit 2; }
    start=$(date +%s)
    call --budget $((total - 60)) --only share-bias --only lend --only transformers --only cost --only nvml-view
    left=$((total - ($(date +%s) - start)))
    if [ "$left" -ge 40 ]; then
        call --budget "$left" --only mps --only driver-api --only pytorch --only cupy --only jax --only nccl \
            --only cuda-graph
    fi
    ;;
*)
    echo "usage: plan.sh first | plan.sh rest SECONDS (docs/real-gpu.md)" >&2
    exit 2
    ;;
esac
