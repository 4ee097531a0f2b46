"""Writers killed with SIGKILL mid-put (chaos/torn_writes.py, the acceptance's small
version): no torn block is visible after the store reopens, and the checker does see one."""

import os
import tempfile

from dualpath.chaos import torn_writes as tw
from dualpath.runtime.store.files import block_path


def test_killed_writers_leave_only_whole_blocks():
    got = tw.run_torn_writes(12, seed=1)
    assert got["kills"] == got["killed_by_sigkill"] == 12
    assert got["torn_visible_after_each_restart"] == 0 and got["torn_visible_at_final_restart"] == 0
    points = got["stall_points"]
    assert points["all_written_not_renamed"] == 1 and points["in_payload"] >= 1
    assert sum(points.values()) == 12


def test_checker_counts_a_damaged_whole_block_and_a_leftover_temp_file(tmp_path):
    root = str(tmp_path)
    t = tw._trial(0, seed=2)
    tw._kill_mid_put(root, t)
    assert tw._torn_after_reopen(root, [t], check_killed=True) == 0
    with open(block_path(root, t.chain[1]), "r+b") as f:  # a whole block damaged behind the store's back
        f.seek(tw.HEADER_BYTES + 10)
        b = f.read(1)[0]
        f.seek(tw.HEADER_BYTES + 10)
        f.write(bytes([b ^ 1]))
    assert tw._torn_after_reopen(root, [t], check_killed=True) == 1
    os.makedirs(os.path.join(root, "zz"), exist_ok=True)
    fd, _ = tempfile.mkstemp(prefix="x" + tw.TEMP_MARK, dir=os.path.join(root, "zz"))
    os.close(fd)  # a temp file the reopen does not remove (its name names no dead writer) counts too
    assert tw._torn_after_reopen(root, [], check_killed=True) == 1
