"""File-level I/O of the block store: names, atomic writes, verified reads, directory scans.

Only POSIX semantics are relied on, so the root may be a shared mount (3FS, CephFS, NFS):

- a block lives at root/<hex[:2]>/<hex>.kvb, hex = the 64-char hex of its chained digest; a
  digest is checked (exactly 32 bytes) before a path is built from it, and only names of 64
  lowercase hex characters are read back from a scan, so no name can lead outside the root;
- it appears there only by `os.replace` of a fully written temp file in the same directory
  (rename within a directory is atomic), so a reader sees a whole block or no block;
- temp files are named <final>.tmp.<pid>.<token>.<host>; a scan removes those left by a
  writer that died (same host and the pid is gone, or older than a grace period measured in
  the file system's own time, for writers on other hosts);
- a corrupt block is renamed aside into root/quarantine/, never deleted silently.

No flock or other advisory locking is used; nothing here is correct only under a lock.
"""

from __future__ import annotations

import mmap
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Callable, Iterator

from dualpath.runtime.store.errors import InvalidDigestError, TruncatedBlockError
from dualpath.runtime.store.format import DIGEST_BYTES, HEADER_BYTES, BlockHeader, parse_header

BLOCK_SUFFIX = ".kvb"
TEMP_MARK = BLOCK_SUFFIX + ".tmp."
QUARANTINE_DIR = "quarantine"
DIRECT_IO_ALIGN_BYTES = 4096  # conservative: every Linux device's logical block divides it
HOST = socket.gethostname().replace("/", "_")
_HEX = frozenset("0123456789abcdef")


def check_digest(digest: object) -> bytes:
    """`digest` as bytes if it is a block digest (exactly DIGEST_BYTES bytes), else InvalidDigestError.
    An int is refused, although `bytes(32)` would make one of zeros."""
    if not isinstance(digest, (bytes, bytearray, memoryview)):
        raise InvalidDigestError(f"a block digest is {DIGEST_BYTES} bytes, got a {type(digest).__name__}: "
                                 f"{str(digest)[:80]!r}")
    raw = bytes(digest)
    if len(raw) != DIGEST_BYTES:
        raise InvalidDigestError(f"a block digest is {DIGEST_BYTES} bytes, got {len(raw)}: {raw[:80]!r}")
    return raw


def is_hex_digest(text: str) -> bool:
    return len(text) == 2 * DIGEST_BYTES and set(text) <= _HEX


def digest_from_hex(text: str) -> bytes:
    """The digest a 64-character lowercase hex name stands for, else InvalidDigestError."""
    if not isinstance(text, str) or not is_hex_digest(text):
        raise InvalidDigestError(f"not a block digest: {str(text)[:80]!r} (expected {2 * DIGEST_BYTES} lowercase "
                                 "hex characters)")
    return bytes.fromhex(text)


def block_path(root: str, digest: bytes) -> str:
    hex_digest = check_digest(digest).hex()
    return os.path.join(root, hex_digest[:2], hex_digest + BLOCK_SUFFIX)


def temp_path(final_path: str) -> str:
    return f"{final_path}.tmp.{os.getpid()}.{secrets.token_hex(6)}.{HOST}"


def aligned_buffer(num_bytes: int) -> mmap.mmap:
    """A page-aligned anonymous buffer (mmap), usable for O_DIRECT I/O."""
    return mmap.mmap(-1, num_bytes)


def is_aligned(address: int, num_bytes: int) -> bool:
    return address % DIRECT_IO_ALIGN_BYTES == 0 and num_bytes % DIRECT_IO_ALIGN_BYTES == 0


def write_all(fd: int, buffers: list[memoryview]) -> None:
    """writev until every byte is written (regular files may still return short counts)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def write_atomically(path: str, write: Callable[[int], None], fsync: bool, made_dirs: set[str]) -> None:
    """Write a file through a temp file beside `path` (`write(fd)` fills it), then rename it into
    place, so a reader sees the whole file or none. With `fsync`, the file and then its directory
    are synced. `made_dirs` remembers the directories already created."""
    directory = os.path.dirname(path)
    tmp = temp_path(path)
    if directory not in made_dirs:
        os.makedirs(directory, exist_ok=True)
        made_dirs.add(directory)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:  # someone removed the fan-out directory meanwhile
        os.makedirs(directory, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            write(fd)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    if fsync:
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def preadv_all(fd: int, buffers: list[memoryview], offset: int) -> int:
    """preadv until the buffers are full or EOF; returns bytes read."""
    views = [b for b in buffers if len(b)]
    total = 0
    while views:
        got = os.preadv(fd, views, offset)
        if got == 0:
            break
        total += got
        offset += got
        while views and got >= len(views[0]):
            got -= len(views[0])
            views.pop(0)
        if views and got:
            views[0] = views[0][got:]
    return total


def read_header(path: str) -> BlockHeader:
    """Parse a block file's header and check the file has exactly the size it declares.

    Raises FileNotFoundError, or a BlockFormatError subclass."""
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(HEADER_BYTES)
        got = preadv_all(fd, [memoryview(buf)], 0)
        if got < HEADER_BYTES:
            raise TruncatedBlockError(f"{path}: {got} bytes, shorter than the header")
        header = parse_header(buf)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size != header.file_bytes:
        raise TruncatedBlockError(f"{path}: {size} bytes, header says {header.file_bytes}")
    return header


def read_block(path: str, header_buf: memoryview, dest: memoryview, direct: bool) -> BlockHeader:
    """Read a block file's header into `header_buf` and its payload straight into `dest` (one
    preadv, no copy), O_DIRECT if `direct` (then both buffers must be 4096-aligned). Returns the
    parsed header; the payload CRC32 is the caller's to check. Raises OSError (EINVAL when the
    file system refuses O_DIRECT) or a BlockFormatError subclass."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        got = preadv_all(fd, [header_buf, dest], 0)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    expected = HEADER_BYTES + len(dest)
    if got != expected or size != expected:
        raise TruncatedBlockError(f"{path}: {size} bytes, a block file has {expected}")
    return parse_header(header_buf)


def quarantine(root: str, path: str) -> str | None:
    """Rename a corrupt or unreadable block aside (atomic; readers holding it open are unaffected).
    Returns the new path, or None if the file was already gone or could not be moved (a failing
    disk: the block is out of the index all the same)."""
    qdir = os.path.join(root, QUARANTINE_DIR)
    target = os.path.join(qdir, f"{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.bad")
    try:
        os.makedirs(qdir, exist_ok=True)
        os.replace(path, target)
    except OSError:
        return None
    return target


def unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class FoundBlock:
    digest: bytes
    path: str
    mtime_ns: int


@dataclass(frozen=True, slots=True)
class FoundTemp:
    path: str
    pid: int
    host: str
    mtime_ns: int


def scan(root: str) -> tuple[list[FoundBlock], list[FoundTemp]]:
    """Every block-named file and every temp file under root/<2 hex>/ (other names ignored)."""
    blocks: list[FoundBlock] = []
    temps: list[FoundTemp] = []
    for sub in _fanout_dirs(root):
        with os.scandir(sub) as it:
            for entry in it:
                found = _classify(entry)
                if isinstance(found, FoundBlock):
                    blocks.append(found)
                elif isinstance(found, FoundTemp):
                    temps.append(found)
    return blocks, temps


def _fanout_dirs(root: str) -> Iterator[str]:
    with os.scandir(root) as it:
        for entry in it:
            if len(entry.name) == 2 and set(entry.name) <= _HEX and entry.is_dir():
                yield entry.path


def _classify(entry: os.DirEntry) -> FoundBlock | FoundTemp | None:
    name = entry.name
    try:
        if TEMP_MARK in name:
            pid, _token, host = name.split(TEMP_MARK, 1)[1].split(".", 2)
            return FoundTemp(entry.path, int(pid), host, entry.stat().st_mtime_ns)
        stem = name[: -len(BLOCK_SUFFIX)]
        if name.endswith(BLOCK_SUFFIX) and is_hex_digest(stem):
            return FoundBlock(digest_from_hex(stem), entry.path, entry.stat().st_mtime_ns)
    except (ValueError, FileNotFoundError):
        return None
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fs_now_ns(root: str) -> int:
    """The file system's notion of now (its mtime for a fresh file): on a shared mount the
    server stamps mtimes, so temp-file ages are compared in the same clock they were written in."""
    probe = temp_path(os.path.join(root, ".probe" + BLOCK_SUFFIX))
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        return os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
        unlink_quietly(probe)


def stale_temps(root: str, temps: list[FoundTemp], stale_temp_age_s: float) -> list[FoundTemp]:
    """Temp files whose writer is gone: same host and dead pid, or older than the grace period."""
    stale = [t for t in temps if t.host == HOST and not _pid_alive(t.pid)]
    stale_paths = {t.path for t in stale}
    rest = [t for t in temps if t.path not in stale_paths]
    if rest:
        now_ns = _fs_now_ns(root)
        stale += [t for t in rest if now_ns - t.mtime_ns > stale_temp_age_s * 1e9]
    return stale
