"""Emulated hosts on one machine: network namespaces, veth links and kernel-enforced rates and lanes
(issue 16.3). `plan.py` is the shape (pure), `netns.py` runs `ip` / `tc`."""
