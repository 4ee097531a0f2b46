"""`dualpath fidelity`: the same work on the local runtime cluster and in the simulator's `local`
preset, and the error of the simulator per metric (above both worlds; nothing imports it)."""
