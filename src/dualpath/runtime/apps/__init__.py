"""What the CLI runs on a local cluster: the demo and its benchmarks, trace replay, `serve`, and
the compute profile and emulated rates the demo is derived from."""
