"""Remote writes over loopback TCP: bytes land exactly, an IMM follows its WRITEs, both lanes
carry their marks on both ends, and a LinkArbiter drives RemoteSpanWrite chunk by chunk.
Hostile peers and authentication: test_remote_write_safety.py."""

import socket
import threading

import numpy as np
import pytest

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.transport.arbiter import LinkArbiter
from dualpath.runtime.transport.integrity import bad_pieces, piece_sums
from dualpath.runtime.transport.remote_write import RemoteSpanWrite, WriteInitiator, WriteTarget, submit_with_immediate
from dualpath.runtime.transport.remote_write import wire
from dualpath.runtime.transport.shm import HostBuffer, ShmRegion
from dualpath.runtime.transport.tcp import lane_socket_options
from remote_write_helpers import WAIT_S, Inbox, sentinel

LC, KV = Lane.LATENCY_CRITICAL, Lane.KV
needs_linux = pytest.mark.skipif(not hasattr(socket, "SO_PRIORITY"), reason="SO_PRIORITY is Linux-only")


@pytest.fixture
def pair():
    """A target with an inbox and three registered segments, and an initiator connected to it."""
    inbox = Inbox()
    target = WriteTarget("127.0.0.1", 0, on_immediate=inbox)
    segments = {"seg-a": sentinel(40_000), "seg-b": sentinel(70_001), "seg-c": sentinel(5_003)}
    for name, array in segments.items():
        target.register(name, array)
    initiator = WriteInitiator(*target.address)
    yield target, initiator, segments, inbox
    initiator.close()
    target.close()


def odd_spans(rng, total, limit, max_span):
    """Disjoint spans of random odd-ish lengths covering `total` bytes inside [0, limit)."""
    spans, pos, left = [], int(rng.integers(0, 7)), total
    while left:
        n = min(left, int(rng.integers(1, max_span)))
        spans.append((pos, n))
        pos += n + int(rng.integers(0, 13))  # gaps: bytes that must stay untouched
        left -= n
    assert pos <= limit
    return spans


def expected_after(dst, src, src_spans, dst_spans):
    """What `dst` holds after copying the spans locally (the reference: transfer.SpanCopy's cut)."""
    out = dst.copy()
    stream = np.concatenate([src[o:o + n] for o, n in src_spans])
    pos = 0
    for o, n in dst_spans:
        out[o:o + n] = stream[pos:pos + n]
        pos += n
    return out


def test_bytes_land_exactly_in_several_segments_through_odd_spans_and_chunks(pair):
    target, initiator, segments, inbox = pair
    rng = np.random.default_rng(7)
    expected = {name: array.copy() for name, array in segments.items()}
    moved_bytes = 0
    for name, base in (("seg-a", 0), ("seg-b", 1_234), ("seg-c", 3)):
        dst_array = segments[name]
        region = ShmRegion(name, base, dst_array.size - base)
        total = region.nbytes // 2
        moved_bytes += total
        src = rng.integers(0, 256, total + 5_000, dtype=np.uint8)
        src_spans = odd_spans(rng, total, src.size, 997)
        dst_spans = odd_spans(rng, total, region.nbytes, 1_501)
        job = RemoteSpanWrite(initiator, KV, src, src_spans, region, dst_spans)
        offset = 0
        while offset < job.nbytes:  # chunks cut at odd places, not at piece boundaries
            n = min(int(rng.integers(1, 4_099)), job.nbytes - offset)
            job(offset, n)
            offset += n
        initiator.immediate(KV, name.encode())
        view = expected[name][base:]
        view[:] = expected_after(view, src, src_spans, dst_spans)
        assert inbox.get()[:2] == (KV, name.encode())
    for name in segments:
        assert np.array_equal(segments[name], expected[name]), name  # the gaps kept the sentinel too
    stats = target.stats()
    assert stats.written_bytes == initiator.stats().sent_bytes == (0, moved_bytes)
    assert stats.bad_frames == (0, 0) and stats.imm_frames == (0, 3)


def test_an_imm_is_delivered_only_after_every_earlier_write_landed(pair):
    target, initiator, segments, inbox = pair
    rng = np.random.default_rng(11)
    want = {name: array.copy() for name, array in segments.items()}
    inbox.check = lambda lane, msg: all(np.array_equal(segments[n], want[n]) for n in segments)
    for round_no in range(5):
        for _ in range(60):  # interleaved writes across segments, sizes from 1 byte to 16 KiB
            name = ("seg-a", "seg-b", "seg-c")[int(rng.integers(0, 3))]
            n = int(rng.integers(1, min(16_385, segments[name].size)))
            at = int(rng.integers(0, segments[name].size - n + 1))
            data = rng.integers(0, 256, n, dtype=np.uint8)
            want[name][at:at + n] = data
            initiator.write(KV, name, at, data)
        initiator.immediate(KV, b"round %d" % round_no)
        lane, message, all_landed = inbox.get()
        assert (lane, message, all_landed) == (KV, b"round %d" % round_no, True)
    assert target.stats().write_frames == (0, 300)


def test_threads_sharing_a_lane_never_interleave_frames(pair):
    target, initiator, _, inbox = pair
    part_bytes = 2**20  # large writes: the kernel takes them in several steps, which could interleave
    region = np.zeros(4 * part_bytes, dtype=np.uint8)
    target.register("big", region)
    data = np.random.default_rng(13).integers(0, 256, region.size, dtype=np.uint8)
    for lane in (LC, KV):  # a small send buffer: every large send waits for room, mid-frame
        initiator.lane_socket(lane).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16_384)

    def writer(k):  # threads 0 and 2 share the LC lane, 1 and 3 the KV lane
        lane = (LC, KV)[k % 2]
        pos, end = k * part_bytes, (k + 1) * part_bytes
        while pos < end:
            n = min(end - pos, 1 + (pos * 7919) % 200_000)
            initiator.write(lane, "big", pos, data[pos:pos + n])
            pos += n

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lane in (LC, KV):
        initiator.immediate(lane, b"end")
    assert sorted(inbox.get()[:2] for _ in range(2)) == [(LC, b"end"), (KV, b"end")]
    assert target.stats().bad_frames == (0, 0)
    assert np.array_equal(region, data)
    assert target.stats().written_bytes == (2 * part_bytes, 2 * part_bytes)

def test_writes_larger_than_one_frame_are_split_and_land(pair, monkeypatch):
    target, initiator, segments, inbox = pair
    from dualpath.runtime.transport.remote_write import initiator as initiator_module

    monkeypatch.setattr(initiator_module, "MAX_WRITE_FRAME_BYTES", 4_096)  # the sender's limit only
    data = np.random.default_rng(3).integers(0, 256, 30_000, dtype=np.uint8)
    initiator.write(LC, "seg-b", 17, data)
    initiator.immediate(LC, b"done")
    assert inbox.get()[:2] == (LC, b"done")
    assert np.array_equal(segments["seg-b"][17:30_017], data)
    assert target.stats().write_frames == (8, 0)  # ceil(30000 / 4096), on the LC lane


def test_a_host_buffer_is_a_target_segment():
    inbox = Inbox()
    with HostBuffer.create(slot_bytes=8192, num_slots=4, prefault=False) as buf, \
            WriteTarget(on_immediate=inbox) as target:
        target.register_buffer(buf)
        region = buf.allocate()
        with WriteInitiator(*target.address, lanes=(KV,)) as initiator:
            data = np.arange(8192, dtype=np.uint16).view(np.uint8)[:8192]
            initiator.write(KV, buf.name, region.offset_bytes, data)
            initiator.immediate(KV, b"x")
            inbox.get()
        assert np.array_equal(buf.view(region), data)
        target.unregister(buf.name)  # drops the target's views, so the buffer can unmap


@needs_linux
def test_both_lanes_carry_their_marks_on_both_ends(pair):
    target, initiator, _, _ = pair
    for lane in (LC, KV):
        opts = lane_socket_options(lane)
        s = initiator.lane_socket(lane)
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == opts.ip_tos
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) == opts.so_priority
    marks = sorted((m.lane, m.ip_tos, m.so_priority) for m in target.connection_marks())
    assert marks == [(LC, 184, 6), (KV, 32, 1)]  # EF / CS1 (tcp.py), SO_PRIORITY set after accept


def test_an_arbiter_drives_remote_span_writes_on_both_lanes_with_checked_bytes(pair):
    target, initiator, segments, inbox = pair
    rng = np.random.default_rng(5)
    arbiter = LinkArbiter("cnic", None, LaneWeights(), MonotonicClock(), chunk_bytes=3_001)
    try:
        jobs = {}
        for lane, name in ((KV, "seg-b"), (LC, "seg-a")):
            region = ShmRegion(name, 100, segments[name].size - 100)
            src = rng.integers(0, 256, 30_000, dtype=np.uint8)
            src_spans = odd_spans(rng, 25_000, src.size, 2_000)
            dst_spans = odd_spans(rng, 25_000, region.nbytes, 3_000)
            job = RemoteSpanWrite(initiator, lane, src, src_spans, region, dst_spans)
            jobs[lane] = (job, piece_sums(job), region)
            want = expected_after(segments[name][100:], src, src_spans, dst_spans)
            jobs[lane] += (want,)
        handles = [submit_with_immediate(arbiter, jobs[lane][0], lambda res, lane=lane: b"done %d" % lane)
                   for lane in (KV, LC)]
        got = sorted(inbox.get()[:2] for _ in handles)
        assert got == [(LC, b"done 0"), (KV, b"done 1")]
        for lane, (job, sums, region, want) in jobs.items():
            view = segments[region.segment][region.offset_bytes:]
            assert np.array_equal(view, want)
            assert bad_pieces(view, sums) == []  # integrity.py's receiver check passes on landed bytes
        assert [h.wait(WAIT_S).nbytes for h in handles] == [25_000, 25_000]
        arbiter.check_invariants()
        assert arbiter.stats().sent_bytes == (25_000, 25_000) == target.stats().written_bytes
    finally:
        arbiter.close()


def test_span_write_rejects_destination_spans_outside_its_region(pair):
    _, initiator, _, _ = pair
    src = np.zeros(100, dtype=np.uint8)
    with pytest.raises(ValueError, match="outside the region"):
        RemoteSpanWrite(initiator, KV, src, [(0, 100)], ShmRegion("seg-a", 0, 50), [(0, 100)])
    with pytest.raises(ValueError, match="outside the source"):
        RemoteSpanWrite(initiator, KV, src, [(50, 100)], ShmRegion("seg-a", 0, 500), [(0, 100)])
    job = RemoteSpanWrite(initiator, KV, src, [(0, 100)], ShmRegion("seg-a", 0, 500), [(0, 100)])
    with pytest.raises(ValueError, match="outside a write"):
        job(90, 20)


def test_the_sender_refuses_what_the_wire_cannot_say(pair):
    _, initiator, _, _ = pair
    with pytest.raises(ValueError, match="offset_bytes"):
        initiator.write(KV, "seg-a", -1, b"x")
    with pytest.raises(ValueError, match="segment name"):
        initiator.write(KV, "s" * 256, 0, b"x")
    with pytest.raises(ValueError, match="immediate"):
        initiator.immediate(KV, bytes(wire.MAX_IMM_BYTES + 1))
    with pytest.raises(ValueError, match="C-contiguous"):
        initiator.write(KV, "seg-a", 0, np.zeros((4, 4), dtype=np.uint8)[:, ::2])
