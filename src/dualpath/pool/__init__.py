"""Where independent simulations run: in this process, one after another (the default), or as
tasks on a Ray cluster (`--ray ADDRESS`, the optional `cluster` extra). See executor.py."""
