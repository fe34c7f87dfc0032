"""The image both image tests run (built once per session: debootstrap takes minutes)."""

from __future__ import annotations

import pytest

from tests.harness import build_package


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> str:
    """`packaging/build.py image`: the plugin and node agent image, in podman's store."""
    archive = build_package("image", tmp_path_factory.mktemp("image"))
    assert archive.name.endswith(".oci.tar") and archive.stat().st_size > 0
    return "localhost/gpuslice/kubelet-plugin:" + archive.name.split("_")[1].removesuffix(".oci.tar")
