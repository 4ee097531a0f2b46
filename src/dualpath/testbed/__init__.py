"""Emulated hosts on one machine: network namespaces, veth links and kernel-enforced rates and lanes
(tests/testbed/test_testbed.py). `plan.py` is the shape (pure), `netns.py` runs `ip` / `tc`."""
