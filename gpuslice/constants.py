"""Node paths and protocol constants, read from gpuslice/csrc/gpuslice_constants.h:
the C programs include that header, so C and Python share one definition."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

HEADER = Path(__file__).resolve().parent / "csrc" / "gpuslice_constants.h"
_DEFINE = re.compile(r'^#define (GS_\w+) (?:"([^"]*)"|(\d+))$', re.M)


@cache
def _defines() -> dict[str, str | int]:
    return {m[1]: m[2] if m[3] is None else int(m[3]) for m in _DEFINE.finditer(HEADER.read_text())}


def _str(name: str) -> str:
    value = _defines()[name]
    assert isinstance(value, str), name
    return value


def _int(name: str) -> int:
    value = _defines()[name]
    assert isinstance(value, int), name
    return value


CONTROL_SOCKET = _str("GS_CONTROL_SOCKET")
RUNTIME_SOCKET_NAME = _str("GS_RUNTIME_SOCKET_NAME")
SLICE_SOCKET_DIR = _str("GS_SLICE_SOCKET_DIR")
SLICE_SOCKET_NAME = _str("GS_SLICE_SOCKET_NAME")
SLICE_SOCKET = _str("GS_SLICE_SOCKET")
STATE_DIR = _str("GS_STATE_DIR")
SLICE_FILES_DIR = _str("GS_SLICE_FILES_DIR")
SLICE_TIMEOUT_S = _int("GS_SLICE_TIMEOUT_S")

ENV_SOCKET = _str("GS_ENV_SOCKET")
ENV_SLICE_SOCKET = _str("GS_ENV_SLICE_SOCKET")
ENV_REAL_LIBCUDA = _str("GS_ENV_REAL_LIBCUDA")
ENV_REAL_LIBNVML = _str("GS_ENV_REAL_LIBNVML")
ENV_RUNTIME = _str("GS_ENV_RUNTIME")
ENV_CDI_SPEC = _str("GS_ENV_CDI_SPEC")

RUNTIME_TIMEOUT_S = _int("GS_RUNTIME_TIMEOUT_S")
RUNTIME_REQUEST_MAX = _int("GS_RUNTIME_REQUEST_MAX")
RUNTIME_REPLY_MAX = _int("GS_RUNTIME_REPLY_MAX")

CDI_KIND = _str("GS_CDI_KIND")
CDI_DEVICE_ENV_PREFIX = _str("GS_CDI_DEVICE_ENV_PREFIX")
CDI_CLAIM_KIND = _str("GS_CDI_CLAIM_KIND")
ENV_CLAIM = _str("GS_ENV_CLAIM")
ENV_SHARE_PREFIX = _str("GS_ENV_SHARE_PREFIX")
CLAIM_SLICE_PREFIX = _str("GS_CLAIM_SLICE_PREFIX")
DEVICES_SLICE_PREFIX = _str("GS_DEVICES_SLICE_PREFIX")

CONTAINER_WRAP_DIR = _str("GS_CONTAINER_WRAP_DIR")
CONTAINER_DRIVER_DIR = _str("GS_CONTAINER_DRIVER_DIR")


def claim_slice_key(uid: str) -> str:
    """The key a DRA claim's slice is listed and released by. Keys are made
    here and never read back: a slice's owner kind and UID are the store's."""
    return CLAIM_SLICE_PREFIX + uid


DEVICES_SLICE_KEY_FORMAT = f"{DEVICES_SLICE_PREFIX} and 24 lowercase hex digits"
_DEVICES_SLICE_KEY = re.compile(re.escape(DEVICES_SLICE_PREFIX) + r"[0-9a-f]{24}\Z")


def devices_slice_key(digest: str) -> str:
    """The key a device plugin allocation's slice is listed and released by:
    the plugin's digest of the resource and its device IDs."""
    return DEVICES_SLICE_PREFIX + digest[:24]


def is_devices_slice_key(key: str) -> bool:
    """Whether `key` has the form devices_slice_key makes (ReserveDevices checks its input)."""
    return bool(_DEVICES_SLICE_KEY.match(key))


def runtime_socket_beside(control_socket: str | Path) -> Path:
    """The runtime socket lives beside the control socket (as gs_runtime_socket() in C)."""
    return Path(control_socket).parent / RUNTIME_SOCKET_NAME
