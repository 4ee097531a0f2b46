"""The router: the shared scheduler over the live cluster (`router.py`) and its metrics."""
