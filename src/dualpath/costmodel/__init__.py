"""The simulator's cost model of the paper's hardware: model shapes (models.py), GPU, NIC and
storage numbers (hardware.py), per-forward FLOPs, bytes and times (cost.py) and the expert-parallel
traffic between nodes (ep_traffic.py). The runtime does not use it; the config's presets and the
simulator do."""
