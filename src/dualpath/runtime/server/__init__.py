"""The OpenAI-compatible HTTP front end; it knows the router only through `runtime/api.py`."""
