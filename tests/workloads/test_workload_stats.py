import pytest

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.jsonl_format import write_trajectories
from dualpath.workloads.mooncake import MooncakeRecord
from dualpath.workloads.stats import WorkloadFormat, detect_format, load_any, trajectory_stats, workload_stats
from dualpath.workloads.trajectory import Trajectory

TRAJS = (
    Trajectory(0, (TurnSpec(100, 30), TurnSpec(50, 20))),
    Trajectory(1, (TurnSpec(64, 1), TurnSpec(63, 1), TurnSpec(0, 5))),
)


def test_trajectory_stats_hand_computed():
    s = trajectory_stats(TRAJS, block_tokens=64)
    # Prompts: agent 0: 100, 180; agent 1: 64, 128, 129. Ends: 130, 200; 65, 129, 134.
    assert s["num_requests"] == 5 and s["num_agents"] == 2
    assert s["mean_turns"] == 2.5
    assert s["mean_total_tokens"] == (200 + 134) / 2
    assert s["mean_context_tokens"] == pytest.approx(((100 + 180) / 2 + (64 + 128 + 129) / 3) / 2)
    assert s["mean_input_tokens"] == pytest.approx((100 + 180 + 64 + 128 + 129) / 5)
    assert s["mean_append_tokens"] == pytest.approx((150 / 2 + 127 / 3) / 2)
    assert s["request_mean_append_tokens"] == pytest.approx(277 / 5)
    assert s["mean_output_tokens"] == pytest.approx((50 / 2 + 7 / 3) / 2)
    assert s["request_mean_output_tokens"] == pytest.approx(57 / 5)
    # Prompt full blocks: 1, 2 | 1, 2, 2. Hits = full blocks of the previous end:
    # agent 0: 0, 130 // 64 = 2; agent 1: 0, 65 // 64 = 1, 129 // 64 = 2.
    assert s["prefix_hit_ratio"] == pytest.approx((0 + 2 + 0 + 1 + 2) / (1 + 2 + 1 + 2 + 2))


def test_hit_ratio_other_block_size():
    s = trajectory_stats(TRAJS, block_tokens=100)
    # Prompt blocks: 1, 1 | 0, 1, 1. Hits: 0, 130 // 100 = 1 | 0, 0, 129 // 100 = 1.
    assert s["prefix_hit_ratio"] == pytest.approx(2 / 4)


def test_agents_do_not_share_blocks():
    same = (Trajectory(0, (TurnSpec(640, 1),)), Trajectory(1, (TurnSpec(640, 1),)))
    assert trajectory_stats(same)["prefix_hit_ratio"] == 0.0


def test_empty_inputs_rejected():
    with pytest.raises(InputError):
        trajectory_stats(())


def test_load_any_detects_format(tmp_path):
    tpath = tmp_path / "t.jsonl"
    write_trajectories(tpath, TRAJS)
    mpath = tmp_path / "m.jsonl"
    mpath.write_text('\n{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]}\n')
    assert detect_format(tpath) is WorkloadFormat.TRAJECTORY
    assert detect_format(mpath) is WorkloadFormat.MOONCAKE
    assert load_any(tpath) == TRAJS
    assert load_any(mpath) == (MooncakeRecord(0.0, 600, 3, (4, 5)),)
    assert workload_stats(load_any(tpath))["num_requests"] == 5
    assert workload_stats(load_any(mpath), block_tokens=64)["prefix_hit_ratio"] == 0.0


@pytest.mark.parametrize(
    "content, problem",
    [
        ("", "empty workload file"),
        ("\n  \n", "empty workload file"),
        ('\n{"agent": 0, "turns": []}\n', " line 2: unknown workload format"),
        ("\n\n{oops\n", " line 3: bad JSON"),
    ],
)
def test_load_any_errors(tmp_path, content, problem):
    path = tmp_path / "w.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match=problem):
        load_any(path)
