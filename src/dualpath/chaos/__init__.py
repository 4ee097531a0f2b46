"""Faults on purpose, each against a clean reference run: engines and the storage service killed,
terminated or frozen at a moment of a request's life (matrix.py; on emulated hosts, testbed.py;
the storage service as a victim, store_victim.py), bits flipped in flight and on disk
(integrity.py), store writers killed mid-put (torn_writes.py). `dualpath chaos` runs them; nothing
in core/, sim/ or runtime/ imports this package."""
