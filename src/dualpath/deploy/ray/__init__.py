"""Ray, the optional `cluster` extra: one actor per engine placed by role (engines.py), the router
host's side of a Ray cluster (driver.py), Ray nodes on the testbed's emulated hosts (testbed.py),
simulations as Ray tasks (pool.py) and `bench ray-repro` (repro_bench.py)."""
