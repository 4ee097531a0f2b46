"""The testbed's root tests: `@pytest.mark.testbed_root` on a test that needs root and iproute2's
`ip` and `tc` (network namespaces, veth links, tc qdiscs: deploy/testbed/netns.py).

Not root: the test is skipped, with that reason (a developer's machine). Root without `ip` or
`tc`: the test fails, naming the package to install, since there a skip would hide that the
testbed never ran (CI runs as root)."""

from __future__ import annotations

import os
import shutil

import pytest

MARKER = "testbed_root"
TOOLS = ("ip", "tc")  # both from the iproute2 package


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: needs root and iproute2 (ip, tc); skipped without root, "
                                       "failed as root without iproute2")


def require_root_and_iproute2() -> None:
    """Skip when not root; fail when root lacks `ip` or `tc`."""
    if os.geteuid() != 0:
        pytest.skip("the testbed needs root (network namespaces and tc qdiscs)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"running as root, but {' and '.join(missing)} not found on PATH: install iproute2 "
                    "(Debian/Ubuntu: apt-get install iproute2)", pytrace=False)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None:
        require_root_and_iproute2()
