# gpuslice package scripts: one body for the .deb and the .rpm (after
# bytecode.sh, which gpuslice-sim's scripts use alone).
# Never rewrites a runtime's configuration: that is `gpuslice install`.
UNITS="gpuslice-daemon.service gpuslice-cdi.service gpuslice-cdi.path"

gpuslice_have_systemd() { [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; }

gpuslice_configure() {
    install -d -m 0700 /var/lib/gpuslice
    install -d -m 0755 /run/gpuslice /var/run/cdi
    if gpuslice_have_systemd; then
        systemctl daemon-reload || true
        systemctl enable $UNITS || true
        systemctl restart gpuslice-daemon.service gpuslice-cdi.path || true
    fi
    gpuslice cdi generate >/dev/null 2>&1 || echo "gpuslice: no CDI spec generated (no NVIDIA driver yet); gpuslice-cdi.path regenerates it"
}

gpuslice_stop() {
    if gpuslice_have_systemd; then
        systemctl disable --now $UNITS || true
    fi
    pkill -f '^/usr/bin/python3 -I /usr/bin/gpuslice daemon' 2>/dev/null || true
    gpuslice_forget_bytecode /usr/lib/gpuslice
}

gpuslice_purge() {
    rm -rf /var/lib/gpuslice /run/gpuslice /etc/gpuslice
    rm -f /var/run/cdi/gpuslice.json
    if gpuslice_have_systemd; then systemctl daemon-reload || true; fi
}
