"""Stand-ins the tests share for pieces of the runtime they do not start."""

from __future__ import annotations


class RecordingOutbox:
    """An engine's outbox as the router holds it (transport/channel.py Outbox): keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, msg) -> None:
        self.sent.append(msg)

    def send_many(self, msgs) -> None:
        self.sent.extend(msgs)

    def close(self) -> None:
        pass
