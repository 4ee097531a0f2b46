"""Child process of the storage-service tests: serves ROOT on 127.0.0.1:PORT; when a digest hex
is given, the write of that block stalls after half its payload (says HALF, waits for SIGKILL)."""

import sys
import threading

from store_helpers import write_half_and_stall

from dualpath.runtime.store import BlockStore
from dualpath.runtime.store.service import start_service


class StallingStore(BlockStore):
    stall_digest: bytes | None = None

    def _write_payload(self, fd, header, view):
        if bytes.fromhex(header[40:72].hex()) != self.stall_digest:  # the header's digest field
            return super()._write_payload(fd, header, view)
        write_half_and_stall(fd, header, view)


if __name__ == "__main__":
    root, port = sys.argv[1], int(sys.argv[2])
    if len(sys.argv) > 3:
        StallingStore.stall_digest = bytes.fromhex(sys.argv[3])
    handle = start_service(root, "127.0.0.1", port, store_class=StallingStore, num_threads=1)
    print(f"listening on {handle.url}", flush=True)
    threading.Event().wait()
