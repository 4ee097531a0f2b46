"""The command line (`dualpath ...`); the commands are wired in main.py."""

from .main import app, main

__all__ = ["app", "main"]
