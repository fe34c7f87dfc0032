"""The official references are had or the test fails: one line naming the
package and the suite, never a skip; a mirror and an override directory can
be named."""

from __future__ import annotations

import pytest

from tests.harness import debian, references


def test_a_reference_that_cannot_be_fetched_fails_naming_package_and_suite(tmp_path, monkeypatch):
    monkeypatch.setattr(debian, "CACHE", tmp_path / "cache")  # nothing fetched yet
    monkeypatch.setenv("GPUSLICE_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")  # nothing listens there
    monkeypatch.delenv("GPUSLICE_REFERENCE_DIR", raising=False)
    with pytest.raises(pytest.fail.Exception) as failed:
        references.reference("cri")
    message = str(failed.value)
    assert len(message.splitlines()) == 1, message
    named = "cannot fetch golang-k8s-cri-api-dev from Debian sid (http://127.0.0.1:9/debian): "
    assert message.startswith(f"reference 'cri' (CRI runtime.v1 api.proto (Kubernetes 1.36)): {named}"), message


def test_an_override_directory_is_read_first_and_only_for_what_it_holds(tmp_path, monkeypatch):
    (tmp_path / "cdi").mkdir()
    monkeypatch.setenv("GPUSLICE_REFERENCE_DIR", str(tmp_path))
    assert references.reference("cdi") == tmp_path / "cdi"
    assert references.reference("oci-runtime-spec").is_relative_to(debian.CACHE)  # not there: fetched
