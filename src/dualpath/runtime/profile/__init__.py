"""This machine's compute profile: prefill and decode step times measured and fitted, cached per
(CPU, model, device, threads) (calibrate.py), and the emulated NIC rates derived from it so that a
run is storage-bound whatever the machine's speed (emulation.py)."""
