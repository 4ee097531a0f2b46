"""The real runtime: engine processes with a real model, a persistent KV store, two read paths,
lanes and the shared scheduler. Imports `core`, `workloads`, `metrics`, `config`; never `sim`."""
