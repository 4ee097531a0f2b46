"""The storage service (`dualpath store serve`) and its client RemoteStore, over loopback TCP:
round trips, crash safety through the service (kill -9 mid-put), corrupt blocks as misses,
restart, hostile frames, the token, and a real cluster whose store is the service."""

from __future__ import annotations

import glob
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import msgpack
import pytest

from dualpath.errors import InputError
from dualpath.runtime.store import BlockStore, PayloadSizeError, PutOutcome
from dualpath.runtime.store.breaker import STORE_RETRY_AFTER_S
from dualpath.runtime.store.remote import RemoteStore, RemoteStoreError, store_for
from dualpath.runtime.store import service as service_mod
from dualpath.runtime.store.files import TEMP_MARK
from dualpath.runtime.store.service import start_service
from dualpath.runtime.store.wire import PROTOCOL_VERSION
from store_helpers import DTYPE, FINGERPRINT, LAYOUT, chain, flip_byte, payloads

HERE = os.path.dirname(os.path.abspath(__file__))
BB = LAYOUT.full_block_bytes
HELLO = {"op": "hello", "version": PROTOCOL_VERSION, "token": None, "fingerprint": FINGERPRINT, "dtype": DTYPE,
         "layout": [LAYOUT.num_layers, LAYOUT.block_tokens, LAYOUT.kv_bytes_per_token_per_layer]}


@pytest.fixture
def service(tmp_path):
    handle = start_service(str(tmp_path / "svc"), "127.0.0.1", 0)
    yield handle
    handle.close()


def remote(url: str, **kw) -> RemoteStore:
    return store_for(url, LAYOUT, FINGERPRINT, DTYPE, **kw)


def block_file(root: str, digest: bytes) -> str:
    (path,) = glob.glob(os.path.join(root, "*", digest.hex()[:2], digest.hex() + ".kvb"))
    return path


def spawn(root: str, port: int = 0, stall: bytes | None = None) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, os.path.join(HERE, "service_child.py"), root, str(port)] + ([stall.hex()] if stall else [])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("listening on tcp://127.0.0.1:"), line
    return proc, line.split()[-1]


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def test_round_trip_is_byte_identical_and_lookup_counts_the_prefix(service):
    digests, data = chain(6), payloads(6)
    with remote(service.url) as store:
        assert store.put_many(zip(digests[:5], data[:5])).outcomes == (PutOutcome.WRITTEN,) * 5
        assert store.put(digests[0], data[0]) is PutOutcome.ALREADY_PRESENT
        out = bytearray(6 * BB)
        assert store.read_into(digests, out) == 5  # block 5 was never put
        assert bytes(out[: 5 * BB]) == b"".join(data[:5])
        assert store.lookup(digests) == 5
        assert store.lookup(digests[:3] + chain(1, seed=9)) == 3
        assert store.lookup(chain(2, seed=9)) == 0
        with pytest.raises(PayloadSizeError):
            store.put(digests[5], data[5][:-1])
        stats = store.stats()
        assert (stats.num_blocks, stats.written_blocks, stats.hit_blocks, stats.miss_blocks) == (5, 5, 5, 1)
        assert stats.used_bytes == 5 * (4096 + BB)


def test_flipped_payload_byte_on_disk_is_a_miss_and_gets_quarantined(service):
    digests, data = chain(5), payloads(5)
    with remote(service.url) as store:
        store.put_many(zip(digests, data))
        flip_byte(block_file(service.service.root, digests[2]), 4096 + 100)
        out = bytearray(5 * BB)
        assert store.read_into(digests, out) == 2
        assert bytes(out[: 2 * BB]) == b"".join(data[:2])
        stats = store.stats()
        assert (stats.checksum_failures, stats.header_failures, stats.quarantined_blocks) == (1, 0, 1)
        assert store.lookup(digests) == 2  # the server dropped the bad block after `verify`
        assert store.put(digests[2], data[2]) is PutOutcome.WRITTEN  # recomputed and stored again
        assert store.read_into(digests, out) == 5 and bytes(out) == b"".join(data)


def test_a_large_get_over_several_streams_ends_at_the_first_gap_or_bad_block(service):
    digests, data = chain(20), payloads(20)
    with remote(service.url, num_threads=4) as store:  # 4 streams of 5 blocks
        store.put_many(zip(digests[:17], data[:17]))
        out = bytearray(20 * BB)
        assert store.read_into(digests, out) == 17
        assert bytes(out[: 17 * BB]) == b"".join(data[:17])
        flip_byte(block_file(service.service.root, digests[13]), 4096 + 1)
        assert store.read_into(digests, out) == 13
        assert store.stats().checksum_failures == 1


def test_flipped_header_byte_counts_a_header_failure(service):
    digests, data = chain(2), payloads(2)
    with remote(service.url) as store:
        store.put_many(zip(digests, data))
        flip_byte(block_file(service.service.root, digests[0]), 50)
        assert store.read_into(digests, bytearray(2 * BB)) == 0
        assert store.stats().header_failures == 1


def test_byte_flipped_in_the_served_reply_is_a_miss_never_the_bad_bytes(service, monkeypatch):
    digests, data = chain(3), payloads(3)
    real = service_mod._sendfile_all
    sent = []

    def corrupting(sock, fd, count):
        sent.append(fd)
        if len(sent) != 2:
            return real(sock, fd, count)
        raw = bytearray(os.pread(fd, count, 0))
        raw[4096 + 7] ^= 0x01
        sock.sendall(raw)

    with remote(service.url) as store:
        store.put_many(zip(digests, data))
        monkeypatch.setattr(service_mod, "_sendfile_all", corrupting)
        out = bytearray(3 * BB)
        assert store.read_into(digests, out) == 1
        assert store.stats().checksum_failures == 1
        assert store.stats().quarantined_blocks == 0  # the file is sound: the server keeps it
        monkeypatch.setattr(service_mod, "_sendfile_all", real)
        assert store.read_into(digests, out) == 3 and bytes(out) == b"".join(data)


def test_restart_rebuilds_the_index_and_the_same_digests_hit(tmp_path):
    root = str(tmp_path / "svc")
    digests, data = chain(4), payloads(4)
    proc, url = spawn(root)
    try:
        store = remote(url)
        store.put_many(zip(digests, data))
    finally:
        kill9(proc)
    proc, url2 = spawn(root, int(url.rsplit(":", 1)[1]))
    try:
        assert url2 == url
        out = bytearray(4 * BB)
        assert store.lookup(digests) == 4  # the pooled connection died; the client reconnects
        assert store.read_into(digests, out) == 4 and bytes(out) == b"".join(data)
        assert store.stats().num_blocks == 4
        store.close()
    finally:
        kill9(proc)


def test_kill_9_mid_put_leaves_no_partial_block_and_keeps_earlier_ones(tmp_path):
    root = str(tmp_path / "svc")
    digests, data = chain(4), payloads(4)
    proc, url = spawn(root, stall=digests[3])
    errors = []
    try:
        store = remote(url)
        store.put_many(zip(digests[:3], data[:3]))

        def put_last():
            try:
                store.put(digests[3], data[3])
            except RemoteStoreError as exc:
                errors.append(exc)

        writer = threading.Thread(target=put_last)
        writer.start()
        assert proc.stdout.readline().strip() == "HALF"  # the server is inside the block's write
    finally:
        kill9(proc)
    writer.join(30)
    assert len(errors) == 1  # the put failed loudly, as a full disk does
    assert glob.glob(os.path.join(root, "*", digests[3].hex()[:2], f"*{TEMP_MARK}*"))  # the half write
    proc, _ = spawn(root, int(url.rsplit(":", 1)[1]))
    try:
        # a call refused while the service was down opened the client's breaker (store/breaker.py):
        # it serves again after its back-off and one probe
        deadline = time.monotonic() + 3 * STORE_RETRY_AFTER_S
        while store.lookup(digests) != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.lookup(digests) == 3
        assert store.lookup(digests[3:]) == 0
        out = bytearray(4 * BB)
        assert store.read_into(digests, out) == 3 and bytes(out[: 3 * BB]) == b"".join(data[:3])
        assert store.put(digests[3], data[3]) is PutOutcome.WRITTEN
        assert store.read_into(digests, out) == 4 and bytes(out) == b"".join(data)
        store.close()
    finally:
        kill9(proc)


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def ask(sock: socket.socket, body: bytes) -> dict:
    sock.sendall(frame(body))
    head = sock.recv(4, socket.MSG_WAITALL)
    (n,) = struct.unpack("<I", head)
    return msgpack.unpackb(sock.recv(n, socket.MSG_WAITALL))


def closed(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_malformed_frames_get_errors_and_the_server_keeps_serving(service):
    pack = msgpack.packb
    with socket.create_connection(service.address) as sock:
        assert ask(sock, pack({"op": "lookup", "digests": []}))["error"]["type"] == "bad_request"  # before hello
        assert ask(sock, pack(HELLO))["ok"] is True
        bad = [b"\xc1\xc1garbage", pack([1, 2]), pack({"op": "launch"}), pack({"op": 7}),
               pack({"op": "lookup", "digests": [b"x" * 31]}), pack({"op": "lookup", "digests": "ab"}),
               pack({"op": "get", "digests": [7]}), pack({"op": "put", "items": [[b"d" * 32, b"short"]]}),
               pack({"op": "put", "items": [b"flat"]}), pack({"op": "lookup", "digests": [b"x" * 32] * 70_000})]
        for body in bad:
            reply = ask(sock, body)
            assert reply["ok"] is False and reply["error"]["type"] == "bad_request", body[:20]
        assert ask(sock, pack({"op": "lookup", "digests": [b"x" * 32]})) == {"ok": True, "n": 0}
    for head in (struct.pack("<I", 0), struct.pack("<I", 0xFFFFFFFF)):
        with socket.create_connection(service.address) as sock:
            sock.sendall(head)
            assert closed(sock)
    with socket.create_connection(service.address) as sock:
        sock.sendall(b"\x10\x00")  # half a length prefix, then hang up
    with socket.create_connection(service.address) as sock:
        for layout in ([0, 4, 512], [2**31, 2**31, 1], [1, 2, True], "2x4x512"):
            assert ask(sock, pack(dict(HELLO, layout=layout)))["error"]["type"] == "bad_request"
        assert ask(sock, pack(dict(HELLO, version=99)))["error"]["type"] == "bad_request"
    digests, data = chain(1), payloads(1)
    with remote(service.url) as store:
        assert store.put(digests[0], data[0]) is PutOutcome.WRITTEN
        assert store.lookup(digests) == 1


def test_token_is_checked_and_required_beyond_loopback(tmp_path):
    with pytest.raises(ValueError, match="token"):
        start_service(str(tmp_path / "a"), "0.0.0.0", 0)
    handle = start_service(str(tmp_path / "b"), "127.0.0.1", 0, token=b"s3cret")
    try:
        with pytest.raises(InputError, match="unauthorized"):
            remote(handle.url)
        token_file = tmp_path / "token"
        token_file.write_text("wrong\n")
        with pytest.raises(InputError, match="unauthorized"):
            remote(f"{handle.url}?token_file={token_file}")
        token_file.write_text("s3cret\n")
        with remote(f"{handle.url}?token_file={token_file}") as store:
            assert store.put(chain(1)[0], payloads(1)[0]) is PutOutcome.WRITTEN
    finally:
        handle.close()


def test_store_for_picks_the_backend_and_rejects_bad_urls(tmp_path, service):
    local = store_for(str(tmp_path / "local"), LAYOUT, FINGERPRINT, DTYPE)
    assert isinstance(local, BlockStore)
    local.close()
    with remote(service.url) as store:
        assert isinstance(store, RemoteStore) and store.root == service.url
    for url in ("http://127.0.0.1:80", "tcp://127.0.0.1", "tcp://127.0.0.1:99999", "tcp://h:1/x", "tcp://h:1?tok=1"):
        with pytest.raises(ValueError):
            remote(url)
    port = service.address[1]
    service.close()
    with pytest.raises(InputError, match="cannot reach"):
        remote(f"tcp://127.0.0.1:{port}")
    service.close = lambda: None  # already closed for the fixture's teardown


@pytest.mark.parametrize("args", [["--listen", "nonsense"], ["--listen", "0.0.0.0:0"], ["--listen", "127.0.0.1:0", "--token-file", "/nonexistent/t"]])
def test_cli_serve_rejects_bad_options_with_one_line_and_exit_2(tmp_path, args):
    res = subprocess.run([sys.executable, "-m", "dualpath.cli", "store", "serve", "--dir", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.startswith("error:") and "Traceback" not in res.stderr


async def _two_turns(cfg) -> tuple[list[list[int]], list[int], object]:
    import asyncio
    import time

    from dualpath.core.blocks import chain_digests
    from dualpath.runtime.api import GenerationRequest, SamplingParams
    from dualpath.runtime.cluster import LocalCluster

    outs, cached = [], []
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        context: list[int] = []
        for i, append in enumerate([list(range(5, 205)), list(range(20, 60))]):
            prompt = tuple(context + append)
            out, hit = [], 0
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, SamplingParams(max_tokens=8, temperature=0))):
                out.append(ev.token_id)
                hit = ev.cached_tokens
            outs.append(out)
            cached.append(hit)
            context = list(prompt) + out
            digests = chain_digests(context[:-1], cfg.block_tokens)  # the DE persists behind its SNIC queue
            deadline = time.monotonic() + 60
            while c.router.store.lookup(digests) < len(digests) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        stats = c.router.store.stats()
    return outs, cached, stats


def test_cluster_through_the_service_gives_the_local_store_tokens_and_hits(service):
    import asyncio

    from dualpath.config import EngineConfig, RuntimeConfig, StoreConfig

    base = dict(model="tiny", engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))
    local_outs, local_cached, _ = asyncio.run(_two_turns(RuntimeConfig(**base)))
    outs, cached, stats = asyncio.run(_two_turns(RuntimeConfig(store=StoreConfig(location=service.url), **base)))
    assert outs == local_outs
    assert cached == local_cached and cached[0] == 0 and cached[1] == (200 + len(outs[0])) // 64 * 64
    assert stats.num_blocks >= (200 + len(outs[0])) // 64  # the engines wrote to the service
    assert service.service.served_blocks >= cached[1] // 64  # and the second turn read from it


def test_service_bench_reports_both_rates_side_by_side_and_leaves_nothing(tmp_path):
    from dualpath.bench.store_service import run_service_bench

    r = run_service_bench(tmp_path, 16 * BB, LAYOUT, 2, rounds=2)
    assert r["num_blocks"] == 16 and r["payload_bytes"] == 16 * BB and r["service_checksum_failures"] == 0
    for cache in ("cold", "warm"):
        c = r[cache]
        assert len(c["local_read_s"]) == len(c["service_read_s"]) == 2
        assert c["ratio"] == pytest.approx(c["service_read_gbps"] / c["local_read_gbps"])
        assert c["local_read_gbps"] == pytest.approx(16 * BB / min(c["local_read_s"]) / 1e9)
    assert r["ratio"] == r["cold"]["ratio"] and r["meets_target"] == (r["ratio"] >= 0.8)
    assert os.listdir(tmp_path) == []


def test_a_frozen_service_costs_the_router_one_timeout_for_many_requests_and_tokens_stay_right(tmp_path):
    """SIGSTOP the storage service between two turns: the router's first lookup times out
    (RuntimeConfig.store.timeout_s), its client's breaker then answers "0 stored" at once
    (store/breaker.py), so the second turn and three more requests cost about one timeout in
    all, not one each; every one finishes with the tokens a local store gives (hits recomputed)."""
    import asyncio
    import time

    from dualpath.config import EngineConfig, RuntimeConfig, StoreConfig
    from dualpath.runtime.api import GenerationRequest, SamplingParams
    from dualpath.runtime.cluster import LocalCluster

    timeout_s, extra = 2.0, 3
    base = dict(model="tiny", engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))
    local_outs, _, _ = asyncio.run(_two_turns(RuntimeConfig(**base)))
    proc, url = spawn(str(tmp_path / "svc"))

    async def frozen_between_turns() -> tuple[list[list[int]], float, dict]:
        async with LocalCluster(RuntimeConfig(store=StoreConfig(location=url, timeout_s=timeout_s), **base),
                                start_timeout_s=180) as c:
            async def greedy(name: str, prompt: tuple) -> list[int]:
                return [ev.token_id async for ev in c.router.generate(
                    GenerationRequest(name, prompt, SamplingParams(max_tokens=8, temperature=0)))]

            first = tuple(range(5, 205))
            outs = [await greedy("t0", first)]
            await asyncio.sleep(1.0)  # the first turn's persists land
            proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            second = first + tuple(outs[0]) + tuple(range(20, 60))
            outs += [await greedy(f"t{i}", second) for i in range(1, 2 + extra)]
            return outs, time.monotonic() - t0, c.router.metrics.store_faults()

    try:
        outs, frozen_s, faults = asyncio.run(asyncio.wait_for(frozen_between_turns(), 120))
    finally:
        proc.send_signal(signal.SIGCONT)
        kill9(proc)
    assert outs[:2] == local_outs and all(o == outs[1] for o in outs[2:])  # the same prompt again: the same tokens
    assert faults["router_skipped_lookups"] >= extra  # answered by the breaker, not the frozen service
    assert frozen_s < 2 * timeout_s + 4.0, frozen_s  # about one timeout (+ compute); each request's two lookups cost one each before
