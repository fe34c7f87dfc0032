#!/usr/bin/env bash
# Set up everything a fresh Debian/Ubuntu machine needs, then run one thing:
#   ./dev.sh demo    containers' workloads sharing a simulated GPU
#   ./dev.sh test    lint + the full test suite
#   ./dev.sh setup   set up only
#   ./dev.sh bench [NAME...]   benchmarks (developer tooling, not shipped)
# Extra arguments after test go to pytest: ./dev.sh test -m unit
# As root it installs the system packages itself; as a normal user it says
# which are missing.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"

what=${1:-}
case "$what" in demo|test|setup|bench) ;; *) echo "usage: $0 demo|test|setup|bench" >&2; exit 2 ;; esac

APT_PACKAGES=(gcc make binutils libc6-dev libyaml-dev python3 python3-venv python3-dev util-linux valgrind)
# container runtimes for the end-to-end tests: installed when root; without
# them (as a normal user) those tests skip with a reason
RUNTIME_PACKAGES=(podman runc containerd docker.io busybox-static
    dpkg-dev lintian rpm rpmlint debootstrap
    python3-click python3-yaml python3-cffi python3-jsonschema python3-prometheus-client python3-tomli-w libyaml-0-2)

wanted=("${APT_PACKAGES[@]}")
[ "$(id -u)" = 0 ] && wanted+=("${RUNTIME_PACKAGES[@]}")
missing=()
for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        echo "dev.sh: missing system packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# each runs the top-level make for its C parts and links them into its package:
# gpuslice (the node's parts) and gpuslice-sim (sim/, the simulated driver)
.venv/bin/python -m pip install -q -e ./sim -e '.[demo,test]'

case "$what" in
    setup) echo "dev.sh: ready (.venv)";;
    demo) exec .venv/bin/gpuslice demo ;;
    bench) exec .venv/bin/python -m bench "${@:2}" ;;
    test)
        .venv/bin/ruff check .
        .venv/bin/ruff format --check .
        tools/typecheck.sh
        set +e
        # three workers: most tests wait rather than compute; the measuring
        # ones run last, two at a time (tests/harness/scheduling.py); -n 0 after
        # it runs everything in one process, in turn
        .venv/bin/python -m pytest -n 3 "${@:2}"
        rc=$?
        # pytest's 5 is "no tests ran": never green
        [ "$rc" = 5 ] && echo "dev.sh: pytest collected no tests" >&2
        exit "$rc"
        ;;
esac
