"""Emulated hosts on one machine (root): network namespaces, veth links and kernel-enforced rates and
lanes (tests/deploy/testbed/test_testbed.py). `plan.py` is the shape (pure), `netns.py` runs `ip` / `tc`,
`probe.py` times a transfer, `tp_hosts.py` puts an engine's rank 1 on a host of its own; `demo.py`,
`driver.py` and `run.py` run the cluster across them; `lanes_bench.py`, `tp_lanes_bench.py` and
`tp_decode.py` are the benchmarks that need them."""
