"""Benchmarks (`dualpath bench ...`): the measuring code behind each command; they print and save
their figures and are not timed tests. Above both worlds: bench/ may import runtime/ and sim/,
nothing imports bench/.

  sim_speed.py    the simulator's wall time and simulated turns per second
  lanes.py        a latency-critical burst beside a saturating KV backlog on one link
  transport.py    KV bytes between two engine processes vs memcpy
  store.py        KV store reads vs a plain O_DIRECT read of the same bytes
  model_speed.py  our model against transformers
"""
