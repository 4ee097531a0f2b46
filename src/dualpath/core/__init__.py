"""Pure code shared by the runtime and the simulator: no I/O, no clock reads, no torch."""
