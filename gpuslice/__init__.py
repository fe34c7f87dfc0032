"""gpuslice: GPU sharing for containers on any OCI runtime."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpuslice")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
