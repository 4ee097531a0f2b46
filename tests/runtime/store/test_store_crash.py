"""A writer killed mid-write leaves no visible partial block; its temp file is cleaned up."""

import os
import selectors
import signal
import subprocess
import sys

from store_helpers import FILE_BYTES, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.runtime.store import files

CHILD = os.path.join(os.path.dirname(__file__), "slow_writer_child.py")
FB = LAYOUT.full_block_bytes


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    assert sel.select(timeout_s), "child said nothing"
    return proc.stdout.readline().strip()


def test_writer_killed_mid_payload_leaves_no_partial_block(tmp_path):
    digests, data = chain(2), payloads(2)
    watcher = open_store(tmp_path)  # a store that is running while the writer dies
    proc = subprocess.Popen([sys.executable, CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(__file__))
    try:
        assert read_line(proc, 60) == "HALF"
        temps = [p for p in files_under(tmp_path) if files.TEMP_MARK in p]
        assert len(temps) == 1 and os.path.getsize(tmp_path / temps[0]) == 4096 + FB // 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(path_of(watcher, digests[1]))
    assert watcher.lookup(digests) == 1  # the miss re-check sees block 0, not the torn block 1
    assert watcher.read_into(digests, bytearray(2 * FB)) == 1
    watcher.close()
    with open_store(tmp_path) as restarted:
        assert restarted.lookup(digests) == 1
        assert restarted.stats().num_blocks == 1 and restarted.stats().used_bytes == FILE_BYTES
        assert [p for p in files_under(tmp_path) if files.TEMP_MARK in p] == []
        out = bytearray(2 * FB)
        assert restarted.read_into(digests, out) == 1 and bytes(out[:FB]) == data[0]
        restarted.put(digests[1], data[1])
        assert restarted.read_into(digests, out) == 2 and bytes(out) == data[0] + data[1]


def _leftover(root, digest: bytes, pid: int, host: str, age_s: float = 0.0) -> str:
    final = files.block_path(str(root), digest)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    path = f"{final}.tmp.{pid}.abcdef.{host}"
    with open(path, "wb") as f:
        f.write(b"partial")
    if age_s:
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - int(age_s * 1e9)))
    return path


def test_leftover_temp_files_are_removed_only_when_their_writer_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    digests = chain(4)
    here = files.HOST
    dead_local = _leftover(tmp_path, digests[0], dead.pid, here)
    live_local = _leftover(tmp_path, digests[1], os.getpid(), here)
    young_remote = _leftover(tmp_path, digests[2], 1, "other.host")
    old_remote = _leftover(tmp_path, digests[3], 1, "other.host", age_s=3600)
    with open_store(tmp_path, stale_temp_age_s=600) as store:
        assert (os.path.exists(dead_local), os.path.exists(old_remote)) == (False, False)
        assert (os.path.exists(live_local), os.path.exists(young_remote)) == (True, True)
        assert store.lookup(digests) == 0 and store.stats().num_blocks == 0
        report = store.refresh()
        assert (report.added_blocks, report.removed_temp_files) == (0, 0)
