"""Named results of the block store: put outcomes, refresh and stats reports."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PutOutcome(enum.Enum):
    WRITTEN = "written"
    ALREADY_PRESENT = "already_present"
    NO_SPACE = "no_space"  # pinned blocks (or a capacity below one block) leave no room
    FOREIGN = "foreign"  # the name holds another model's / layout's / version's block
    WRITE_FAILED = "write_failed"  # the file system refused the write (ENOSPC, EIO, ...): not stored


@dataclass(frozen=True, slots=True)
class PutReport:
    digests: tuple[bytes, ...]
    outcomes: tuple[PutOutcome, ...]  # aligned with `digests`

    @property
    def written(self) -> tuple[bytes, ...]:
        return tuple(d for d, o in zip(self.digests, self.outcomes) if o is PutOutcome.WRITTEN)


@dataclass(frozen=True, slots=True)
class RefreshReport:
    added_blocks: int
    dropped_blocks: int
    removed_temp_files: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    num_blocks: int
    used_bytes: int
    capacity_bytes: int | None
    hit_blocks: int  # blocks returned by read_into
    miss_blocks: int  # blocks asked of read_into and not returned
    written_blocks: int
    evicted_blocks: int
    checksum_failures: int  # payload CRC32 mismatches seen by reads
    header_failures: int  # headers that failed validation (corrupt, truncated, misplaced)
    quarantined_blocks: int
    direct_read_blocks: int  # blocks read with O_DIRECT
    read_errors: int = 0  # block reads that failed with an OS error (EIO, EISDIR, ...): misses, never used
    write_failures: int = 0  # puts the file system refused (ENOSPC, EIO, ...): skipped, nothing left behind
    service_errors: int = 0  # RemoteStore: requests the storage service did not answer
