"""The daemon's config (allocator/config.py): a key read as given, its default
where absent, and a bad value one line naming the key and what is accepted."""

from __future__ import annotations

import pytest

from gpuslice import constants
from gpuslice.allocator import config

pytestmark = pytest.mark.unit


def test_the_runtime_socket_deadline_is_read_and_defaults_to_the_clients_wait(tmp_path):
    path = tmp_path / "daemon.yaml"
    path.write_text("runtime_request_timeout: 4.5\n")
    assert config.load(path).runtime_request_timeout == 4.5
    path.write_text("sweep_interval: 1\n")
    assert config.load(path).runtime_request_timeout == constants.RUNTIME_TIMEOUT_S


@pytest.mark.parametrize(("value", "said"), [("60", "greater than the maximum of 30"), ("0", "less than or equal"),
                                             ("soon", "not of type 'number'")])  # fmt: skip
def test_a_runtime_socket_deadline_past_the_clients_wait_or_none_is_one_line(tmp_path, value, said):
    path = tmp_path / "daemon.yaml"
    path.write_text(f"runtime_request_timeout: {value}\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert str(e.value).count("\n") == 0 and "runtime_request_timeout" in str(e.value) and said in str(e.value)


def test_unsliced_processes_are_charged_unless_kill_is_asked_and_nothing_else_is_accepted(tmp_path):
    path = tmp_path / "daemon.yaml"
    path.write_text("sweep_interval: 1\n")
    assert config.load(path).unsliced_processes == "charge"
    path.write_text("unsliced_processes: kill\n")
    assert config.load(path).unsliced_processes == "kill"
    path.write_text("unsliced_processes: ignore\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert str(e.value) == f"config {path}: unsliced_processes: 'ignore' is not one of ['charge', 'kill']"
