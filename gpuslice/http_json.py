"""A JSON reply from an http.server handler, sized and typed, and a request
body read within bounds: what the scheduler extender and the admission
webhook serve (and the API stand-in the tests run)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any


def send_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def read_bounded(handler: BaseHTTPRequestHandler, max_body: int, slots: threading.BoundedSemaphore) -> bytes | None:
    """The request's body, with one of the slots taken (the caller releases it);
    None once an error was answered: no length (411), more than `max_body`
    bytes (413), or every slot busy (503, at once: the caller's retry decides)."""
    handler.close_connection = True  # until the body is read: an unread one would be taken for the next request
    try:
        length = int(handler.headers.get("Content-Length", ""))
    except ValueError:
        send_json(handler, 411, {"error": "a Content-Length is required"})
        return None
    if not 0 <= length <= max_body:
        send_json(handler, 413, {"error": f"a body of {length} bytes (accepted: up to {max_body})"})
        return None
    if not slots.acquire(blocking=False):
        send_json(handler, 503, {"error": "every slot is busy; try again"})
        return None
    data = handler.rfile.read(length)
    handler.close_connection = handler.request_version != "HTTP/1.1" or handler.headers.get("Connection") == "close"
    return data
