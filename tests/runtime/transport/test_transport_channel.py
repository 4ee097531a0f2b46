"""Control messages over ZeroMQ, and a Full Block moved between two processes."""

import multiprocessing as mp
import zlib

import pytest

from dualpath.bench.transport import KvPull, KvReady, ShmKvReceiver, holder_process_main
from dualpath.runtime.transport.channel import Inbox, Outbox, SendsTogether, ipc_endpoint
from dualpath.runtime.transport.messages import Stop, decode, encode
from dualpath.runtime.transport.shm import HostBuffer


def test_messages_round_trip():
    for msg in (KvPull(7, None, "psm_x", 4096, 100, "ipc:///tmp/a.ipc"), KvReady(1, 3, "seg", 0, 5), Stop("bye")):
        assert decode(encode(msg)) == msg


def test_unknown_messages_are_rejected():
    with pytest.raises(TypeError):
        encode(("not", "a", "message"))
    with pytest.raises(ValueError):
        decode(encode(Stop("x")).replace(b"Stop", b"Spot"))


def test_inbox_outbox_keep_order_and_time_out(tmp_path):
    ep = ipc_endpoint(tmp_path, "inbox")
    with Inbox(ep) as inbox, Outbox(ep) as outbox:
        for i in range(50):
            outbox.send(KvReady(i, i, "s", i, 1))
        assert [inbox.recv(5.0).request_id for _ in range(50)] == list(range(50))
        assert inbox.recv(timeout_s=0.01) is None


def test_send_many_arrives_together_in_order_and_a_bad_part_is_dropped_alone(tmp_path):
    import zmq

    ep = ipc_endpoint(tmp_path, "inbox")
    with Inbox(ep) as inbox, Outbox(ep) as outbox:
        outbox.send(KvReady(0, 0, "s", 0, 1))
        outbox.send_many([KvReady(i, i, "s", i, 1) for i in (1, 2, 3)])
        outbox.send_many([])  # nothing is sent
        assert inbox.recv(5.0).request_id == 0
        assert inbox.recv(5.0).request_id == 1
        # the rest of the frame is here with its first: no wait, even with a zero timeout
        assert [inbox.recv(0).request_id, inbox.recv(0).request_id] == [2, 3]
        assert inbox.recv(0.01) is None
        raw = zmq.Context.instance().socket(zmq.PUSH)
        raw.connect(ep)
        raw.send_multipart([encode(KvReady(4, 4, "s", 4, 1)), b"not a message", encode(KvReady(5, 5, "s", 5, 1))])
        assert [inbox.recv(5.0).request_id, inbox.recv(0).request_id] == [4, 5] and inbox.bad_frames == 1
        raw.close(linger=0)


def test_sends_together_hold_each_outboxs_messages_until_the_block_ends(tmp_path):
    a_ep, b_ep = ipc_endpoint(tmp_path, "a"), ipc_endpoint(tmp_path, "b")
    with Inbox(a_ep) as a, Inbox(b_ep) as b, Outbox(a_ep) as to_a, Outbox(b_ep) as to_b:
        sends = SendsTogether()
        sends.send(to_a, KvReady(0, 0, "s", 0, 1))  # outside the block: at once
        assert a.recv(5.0).request_id == 0
        with sends.together():
            for i in (1, 2):
                sends.send(to_a, KvReady(i, i, "s", i, 1))
                sends.send(to_b, KvReady(10 + i, i, "s", i, 1))
            assert a.recv(0.05) is None and b.recv(0.05) is None  # held
        assert [a.recv(5.0).request_id, a.recv(0).request_id] == [1, 2]
        assert [b.recv(5.0).request_id, b.recv(0).request_id] == [11, 12]


def test_ipc_path_length_is_checked(tmp_path):
    with pytest.raises(ValueError):
        ipc_endpoint(tmp_path / ("x" * 120), "a")


def test_blocks_move_between_processes_intact_with_their_kv_ready(tmp_path):
    num_blocks, block_bytes = 6, 256 * 1024 + 512  # not a multiple of the link's chunk
    ctx = mp.get_context("spawn")
    holder_ep, my_ep = ipc_endpoint(tmp_path, "holder"), ipc_endpoint(tmp_path, "me")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=holder_process_main, args=(holder_ep, num_blocks, block_bytes, 64 * 1024, child))
    proc.start()
    try:
        assert parent.poll(60.0)
        tag, src_crc = parent.recv()
        assert tag == "ready"
        buf = HostBuffer.create(block_bytes, num_blocks)
        receiver = ShmKvReceiver(buf, my_ep)
        holder = Outbox(holder_ep)
        regions = [buf.allocate() for _ in range(num_blocks)]
        for i, r in reversed(list(enumerate(regions))):  # any order: readiness names the block
            holder.send(KvPull(i, None, r.segment, r.offset_bytes, r.nbytes, my_ep))
        ready = {}
        for _ in range(num_blocks):
            msg = receiver.recv(timeout_s=30.0)
            assert msg is not None
            ready[msg.request_id] = msg
        for i, r in enumerate(regions):
            assert ready[i] == KvReady(i, None, r.segment, r.offset_bytes, r.nbytes)
        crc = 0
        for i in range(num_blocks):
            crc = zlib.crc32(receiver.view(ready[i]), crc)
        assert crc == src_crc
        holder.send(Stop("test done"))
        assert parent.poll(30.0) and parent.recv()[0] == "done"
        holder.close()
        receiver.close()
        for r in regions:
            buf.free(r)
        buf.check_invariants()
        buf.close()
    finally:
        proc.join(timeout=30.0)
        if proc.is_alive():
            proc.terminate()
    assert proc.exitcode == 0
