"""Discrete-event cluster simulator that runs the shared `dualpath.core` policy."""
