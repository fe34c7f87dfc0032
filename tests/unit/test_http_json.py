"""JsonServer's bounds, on the loopback: how many connections it holds open, and
that a full house turns a caller away at once rather than queueing it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gpuslice import http_json

pytestmark = pytest.mark.unit


class Echo(http_json.JsonServer):
    accepted = "POST /echo"

    def post(self, path: str, body: bytes):  # type: ignore[no-untyped-def]
        return (200, json.loads(body)) if path == "/echo" else None


@pytest.fixture
def server(monkeypatch) -> Iterator[Echo]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(http_json, "MAX_CONNECTIONS", 2)
    s = Echo("127.0.0.1", 0, max_body=1024, max_in_flight=4)
    thread = threading.Thread(target=s.serve, daemon=True)
    thread.start()
    yield s
    s.stopping.set()
    thread.join(10)


def healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def test_connections_past_the_bound_are_closed_at_once_and_served_again_once_one_ends(server):
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while server.http.connections._value > 0:  # type: ignore[attr-defined]  # both taken by their threads
            assert time.monotonic() < deadline, "the two silent connections were never accepted"
            time.sleep(0.01)
        third = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        started = time.monotonic()
        assert third.recv(1) == b"" and time.monotonic() - started < 5  # closed as accepted, not after a timeout
        third.close()
        silent.pop().close()  # its thread reads the end and gives the place back
        deadline = time.monotonic() + 10
        while True:
            try:
                assert healthz(server.port) == 200
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                assert time.monotonic() < deadline, "no place came free after a connection ended"
                time.sleep(0.01)
    finally:
        for s in silent:
            s.close()
