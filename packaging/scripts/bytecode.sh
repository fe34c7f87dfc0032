# bytecode Python wrote at run time is not the package's: it must not keep directories alive
gpuslice_forget_bytecode() {
    find "$1" -name __pycache__ -type d -prune -exec rm -rf {} + 2>/dev/null || true
}
