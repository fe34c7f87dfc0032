"""gpuslice: GPU sharing for containers on any OCI runtime."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # looked up on demand: hooks and the runtime shim start on every container
    # start and never need it (importlib.metadata costs ~40 ms to import)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("gpuslice")
        except PackageNotFoundError:  # a source tree that is not installed
            return "0.0.0+source"
    raise AttributeError(name)
