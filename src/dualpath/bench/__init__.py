"""Benchmarks that do not belong to one package (model speed against transformers)."""
