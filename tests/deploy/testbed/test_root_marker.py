"""The testbed's root marker (tests/deploy/testbed/conftest.py): not root skips with its reason; root
without iproute2 fails naming the package, so a CI machine that lost `ip` or `tc` cannot pass by
skipping every testbed test."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest


def _conftest():
    spec = importlib.util.spec_from_file_location("testbed_conftest", Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_not_root_skips_with_the_reason(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        _conftest().require_root_and_iproute2()


@pytest.mark.parametrize("missing", [("ip",), ("tc",), ("ip", "tc")])
def test_root_without_iproute2_fails_naming_the_package(monkeypatch, missing):
    which = shutil.which
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None if name in missing else which(name) or f"/usr/sbin/{name}")
    with pytest.raises(pytest.fail.Exception) as failed:
        _conftest().require_root_and_iproute2()
    assert "install iproute2" in str(failed.value) and " and ".join(missing) + " not found" in str(failed.value)


def test_root_with_iproute2_runs(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/sbin/{name}")
    _conftest().require_root_and_iproute2()  # neither skips nor fails

