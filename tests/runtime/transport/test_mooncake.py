"""transport/mooncake.py: two Mooncake Transfer Engines in one process over loopback TCP. The bytes of
a span list land where the pieces say and nowhere else; a peer that is not there, or an address
outside what it registered, is a clear error; without the package, one InputError saying what to
install. Tests that need the engine skip where it does not load (the default install lacks it)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dualpath.errors import InputError
from dualpath.runtime.transport.mooncake import (INSTALL_HINT, MooncakeAddress, MooncakeTransfer, MooncakeWriteError,
                                                 address_of, engine_class, kv_lane_env)


def _loads() -> bool:
    try:
        engine_class()
    except InputError:
        return False
    return True


needs_mooncake = pytest.mark.skipif(not _loads(), reason="Mooncake Transfer Engine does not load: pip install "
                                    "'dualpath[mooncake]' and apt-get install libibverbs1 librdmacm1 libnuma1")


@pytest.fixture(scope="module")
def pair():
    a, b = MooncakeTransfer.start(), MooncakeTransfer.start()
    yield a, b
    a.close()
    b.close()


@needs_mooncake
def test_a_span_list_lands_in_the_peers_segments_and_nowhere_else(pair):
    a, b = pair
    landing, buffer = np.zeros(8192, dtype=np.uint8), np.zeros(4096, dtype=np.uint8)
    b.register("landing", landing)
    b.register("buffer", buffer)
    src = np.random.default_rng(1).integers(0, 256, 16384, dtype=np.uint8)
    peer = MooncakeAddress.from_text(b.address().to_text())  # as a message carries it
    assert peer.segments == {"landing": (address_of(landing), 8192), "buffer": (address_of(buffer), 4096)}
    s = address_of(src)
    a.write(peer, [(s + 100, "landing", 1000, 3000), (s + 9000, "landing", 6000, 1), (s, "buffer", 4000, 96),
                   (s, "buffer", 0, 0)])
    assert bytes(landing[1000:4000]) == bytes(src[100:3100]) and landing[6000] == src[9000]
    assert bytes(buffer[4000:]) == bytes(src[:96])
    untouched = np.ones(landing.size, dtype=bool)
    untouched[1000:4000] = untouched[6000] = False
    assert not landing[untouched].any() and not buffer[:4000].any()  # nothing outside the pieces


@needs_mooncake
def test_an_absent_peer_a_foreign_address_and_an_unknown_segment_are_clear_errors(pair):
    a, b = pair
    dst = np.zeros(64, dtype=np.uint8)
    b.register("dst", dst)
    src = np.full(64, 7, dtype=np.uint8)
    with pytest.raises(MooncakeWriteError, match="to 127.0.0.1:1 failed"):  # nobody answers there
        a.write(MooncakeAddress("127.0.0.1:1", {"dst": (address_of(dst), 64)}), [(address_of(src), "dst", 0, 64)])
    stray = np.zeros(64, dtype=np.uint8)  # memory the peer never registered: it refuses the write
    with pytest.raises(MooncakeWriteError, match="refused"):
        a.write(MooncakeAddress(b.session, {"dst": (address_of(stray), 64)}), [(address_of(src), "dst", 0, 64)])
    assert not stray.any() and not dst.any()
    with pytest.raises(ValueError, match="registered no segment 'landing2'"):
        a.write(b.address(), [(address_of(src), "landing2", 0, 8)])
    with pytest.raises(ValueError, match="outside segment dst"):
        a.write(b.address(), [(address_of(src), "dst", 60, 8)])
    a.write(b.address(), [(address_of(src), "dst", 0, 64)])  # the engine still works after the refusals
    assert bytes(dst) == bytes(src)


def test_without_the_package_one_input_error_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as if it were not installed: import fails
    for call in (engine_class, MooncakeTransfer.start):
        with pytest.raises(InputError) as err:
            call()
        assert INSTALL_HINT in str(err.value) and "dualpath[mooncake]" in str(err.value)
        assert "libibverbs1 librdmacm1 libnuma1" in str(err.value)


def test_addresses_round_trip_and_a_missing_one_is_named():
    addr = MooncakeAddress("10.0.0.2:15001", {"seg": (140000000000, 4096)})
    assert MooncakeAddress.from_text(addr.to_text()) == addr
    with pytest.raises(ValueError, match="needs the peer's address"):
        MooncakeAddress.from_text("")  # a peer of ours, not of Mooncake's
    with pytest.raises(ValueError, match="not a Mooncake address"):
        MooncakeAddress.from_text("127.0.0.1:5000")


def test_the_kv_lane_is_the_low_priority_service_level_and_traffic_class():
    assert kv_lane_env(2) == {"MC_IB_SL": "2", "MC_IB_TC": "32"}  # DSCP CS1 (8) << 2
