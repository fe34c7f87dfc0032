"""The error kinds every component raises, one module for all.

Each kind carries the code it maps to (its `status`): the gRPC status of the control API, the
runtime socket's `error` reply, and the `code` label of the RPC metrics.  str()
of an error is the one line a user sees; it names what was wrong and what is
accepted.  Code that is not ours (OSError, a library's error) is INTERNAL
unless it is caught and raised again as one of these."""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Named as gRPC names its status codes (grpc.StatusCode[code.name])."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the caller's input is wrong
    NOT_FOUND = "NOT_FOUND"  # no such slice, process, device
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"  # the node or the slice is not in a state for this
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # no room on the GPUs, no space on disk
    UNAVAILABLE = "UNAVAILABLE"  # a dependency (NVML, the daemon) cannot be reached
    INTERNAL = "INTERNAL"  # a bug: logged with its traceback


class GpusliceError(Exception):
    status = Code.INTERNAL


class InvalidArgument(GpusliceError, ValueError):
    status = Code.INVALID_ARGUMENT


class NotFound(GpusliceError, LookupError):
    status = Code.NOT_FOUND


class AlreadyExists(GpusliceError):
    status = Code.ALREADY_EXISTS


class FailedPrecondition(GpusliceError):
    status = Code.FAILED_PRECONDITION


class ResourceExhausted(GpusliceError):
    status = Code.RESOURCE_EXHAUSTED


class Unavailable(GpusliceError):
    status = Code.UNAVAILABLE


_ANSWERED = (InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, ResourceExhausted, Unavailable)
KINDS: dict[Code, type[GpusliceError]] = {kind.status: kind for kind in _ANSWERED}


def code_of(error: BaseException) -> Code:
    return error.status if isinstance(error, GpusliceError) else Code.INTERNAL


def one_line(text: str) -> str:
    """A message as one line (a reply line, a metrics-safe log line)."""
    return " ".join(text.strip("'\"").split())
