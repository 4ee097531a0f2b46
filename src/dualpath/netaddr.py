"""Which addresses stay on this machine: the one rule every listener applies before it binds
without a shared token (the storage service, remote-write targets, control channels)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine ("localhost", 127.0.0.0/8, ::1). A name other than
    localhost, or a wildcard such as 0.0.0.0 or "*", may be reached from elsewhere: False."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
