"""A real Prometheus (Debian 12's `prometheus` package, fetched and unpacked
by tests/harness/debian.py, never installed) scraping gpuslice daemons, and
its HTTP query API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice.cli.sim_daemon import free_port
from tests.harness import debian

SUITE = "bookworm"


def binary() -> Path:
    try:
        root = debian.unpacked(("prometheus",), SUITE)
    except debian.FetchError as e:
        pytest.fail(f"prometheus: {e}", pytrace=False)
    return root / "usr" / "bin" / "prometheus"


class Prometheus:
    """One server scraping `targets` (host:port) every `interval` seconds."""

    def __init__(self, workdir: Path, targets: list[str], interval: float = 1.0) -> None:
        self.port = free_port()
        config = {"global": {"scrape_interval": f"{int(interval * 1000)}ms",
                             "evaluation_interval": f"{int(interval * 1000)}ms"},
                  "scrape_configs": [{"job_name": "gpuslice", "static_configs": [{"targets": targets}]}]}  # fmt: skip
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.proc = subprocess.Popen(
            [str(binary()), f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.2)
        self.close()
        pytest.fail(f"prometheus did not start: {self.log.read_text()[-500:]}", pytrace=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; the answer's data (a failed query raises with Prometheus's error)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        if body.get("status") != "success":
            raise AssertionError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query's series."""
        return self.api("query", query=expr)["result"]

    def targets_up(self) -> bool:
        active = self.api("targets")["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
