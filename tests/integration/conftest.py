"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.machine import Agent


@pytest.fixture
def started() -> Iterator[list[Agent]]:
    """The agents a test starts (Slice.agent appends them), closed after it."""
    agents: list[Agent] = []
    yield agents
    for a in agents:
        a.close()
