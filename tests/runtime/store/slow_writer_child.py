"""Child process of the crash test: writes block 0 of a chain, then half of block 1's payload,
says HALF and waits to be killed with SIGKILL."""

import sys

from store_helpers import DTYPE, FINGERPRINT, LAYOUT, chain, payloads, write_half_and_stall

from dualpath.runtime.store import BlockStore


class HalfWriter(BlockStore):
    stall_next_write = False

    def _write_payload(self, fd, header, view):
        if not self.stall_next_write:
            return super()._write_payload(fd, header, view)
        write_half_and_stall(fd, header, view)


if __name__ == "__main__":
    digests, data = chain(2), payloads(2)
    store = HalfWriter(sys.argv[1], LAYOUT, FINGERPRINT, DTYPE, num_threads=1)
    store.put(digests[0], data[0])
    store.stall_next_write = True
    store.put(digests[1], data[1])
    print("NOT KILLED", flush=True)
