"""The real helm for the tests (tools/helm.py): a test that needs it and
cannot have it, or whose helm call fails, fails with helm's one line."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tools import helm as real
from tools.helm import CHART, template_args

__all__ = ["CHART", "helm", "template", "template_args"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        return real.helm(*args, check=check)
    except real.HelmError as e:
        pytest.fail(str(e), pytrace=False)


def template(kube_version: str, *sets: str, **kw: Any) -> list[dict]:
    try:
        return real.template(kube_version, *sets, **kw)
    except real.HelmError as e:
        pytest.fail(str(e), pytrace=False)
