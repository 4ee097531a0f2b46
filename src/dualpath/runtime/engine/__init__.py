"""Engine processes: the shared base (model, emulated NICs, store, mail), the prefill and decode
roles, and `main.engine_main`, the factory above both."""
