"""A DE-path pull for a request its DE has already let go (cancelled) is answered, and the PE's
forward goes on. Before, the DE dropped such a pull and the PE's forward waited for its layer
forever: every later request queued behind it (found by `dualpath bench soak`, whose clients
disconnect and cancel). Every pull is answered once, by `LayerReady` or `LayerDropped`, so no write
lands in the landing zone after the forward has moved on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("zmq")

from dualpath.core.snapshot import ReadSide  # noqa: E402
from dualpath.runtime.engine.decode import DecodeEngine  # noqa: E402
from dualpath.runtime.engine.kv_stream import PrefillKvStream  # noqa: E402
from dualpath.runtime.engine.prefill_request import PrefillRequest  # noqa: E402
from dualpath.runtime.protocol import LayerDropped, LayerPull, PrefillAssign  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM, CACHED = 4, 2, 8, 64
BYTES_PER_TOKEN_LAYER = 2 * KV_HEADS * HEAD_DIM * 4  # K and V, float32


class FakeMail:
    """Sent messages, and the messages the engine will receive, in order."""

    def __init__(self, incoming: list, ended: set[int] = frozenset()) -> None:
        self.sent: list[tuple[str, object]] = []
        self.incoming, self._ended, self.held = list(incoming), set(ended), []

    def send(self, endpoint: str, msg: object) -> None:
        self.sent.append((endpoint, msg))

    def has_ended(self, rid: int) -> bool:
        return rid in self._ended

    def hold(self, rid: int, msg: object) -> None:
        self.held.append(msg)


def test_the_de_answers_a_pull_for_a_request_it_let_go():
    de = object.__new__(DecodeEngine)  # only what `_when_assigned` reads
    de.reqs, de.mail = {}, FakeMail([], ended={7})
    handle = de._when_assigned(lambda m: pytest.fail("no such request here"), ended=de._pull_of_ended)
    handle(LayerPull(7, 2, CACHED, "seg", 0, "tcp://pe", ""))
    assert de.mail.sent == [("tcp://pe", LayerDropped(7, 2))]
    handle(LayerPull(8, 0, CACHED, "seg", 0, "tcp://pe", ""))  # not assigned yet: waits for its assignment
    assert de.mail.held == [LayerPull(8, 0, CACHED, "seg", 0, "tcp://pe", "")] and len(de.mail.sent) == 1


class FakePrefillEngine:
    """What PrefillKvStream reads of its engine; `pump` delivers the scripted messages and fails
    where the real engine would wait forever."""

    def __init__(self, incoming: list) -> None:
        self.mcfg = SimpleNamespace(num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
        self.layout = SimpleNamespace(kv_bytes_per_token_per_layer=BYTES_PER_TOKEN_LAYER)
        self.mail = FakeMail(incoming)
        self.lost_engines: set[int] = set()
        self.spec = SimpleNamespace(landing=("landing-seg",), endpoint="tcp://pe", engine=0)
        self.peers = SimpleNamespace(data_endpoint="")
        self.dtype = torch.float32
        self.stream: PrefillKvStream | None = None

    def pump(self, until, timeout_s: float = 0.05) -> None:
        while not until():
            if not self.mail.incoming:
                raise AssertionError("the forward waits for a load that never comes")
            msg = self.mail.incoming.pop(0)
            assert isinstance(msg, LayerDropped)
            self.stream.layer_dropped(msg)


def _de_path_request(rid: int) -> PrefillRequest:
    a = PrefillAssign(rid, list(range(CACHED + 8)), CACHED, [b"x"], int(ReadSide.DECODE), 1, "tcp://de", "seg", "",
                      [0, 1], [], 0.0, 1.0, 0, False, True)
    return PrefillRequest(a, CACHED, cached=CACHED, prompt=list(a.prompt_ids))


def test_the_pes_forward_goes_on_past_a_dropped_load_and_pulls_no_more():
    r = _de_path_request(7)
    eng = FakePrefillEngine([LayerDropped(7, 0), LayerDropped(7, 1)])
    landing = np.full(2 * CACHED * BYTES_PER_TOKEN_LAYER, 0xAB, dtype=np.uint8)  # stale bytes from before
    eng.stream = stream = PrefillKvStream(eng, landing, layerwise=True, depth_layers=2, compute_dtype=torch.float32)
    stream.start_load([(r, 8)])
    for layer in range(LAYERS):
        (kv,) = stream.wait_for_layer_load(layer)
        assert torch.count_nonzero(kv.kv) == 0  # zeros, never the zone's stale bytes
    pulls = [m for _, m in eng.mail.sent if isinstance(m, LayerPull)]
    assert [(m.rid, m.layer) for m in pulls] == [(7, 0), (7, 1)]  # the two in flight; none after the drop
