"""The daemon's Python client, where it waits on its own: the compute controller's fit."""

from __future__ import annotations

import threading
import time

import pytest

from gpuslice.client import AllocatorClient

pytestmark = pytest.mark.unit


def test_a_wait_for_the_fit_ends_when_it_is_told_to_stop(tmp_path):
    """The selftest stopped by SIGTERM while the daemon fitted its slices' costs waited out the
    whole fit wait before unwinding; with the stop event it ends at once."""
    with AllocatorClient(tmp_path / "no-daemon.sock") as client:
        client.list = lambda: []  # type: ignore[method-assign]  # nothing settles
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        began = time.monotonic()
        assert client.compute_settled(["a"], timeout=60, stop=stop) is None
        assert time.monotonic() - began < 10  # the stop, not the 60 s timeout
        assert client.compute_settled(["a"], timeout=0.2) is None  # without one: its timeout
