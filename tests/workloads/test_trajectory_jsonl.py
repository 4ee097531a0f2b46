import pytest

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.jsonl_format import read_trajectories, write_trajectories
from dualpath.workloads.trajectory import Trajectory

GOOD = '{"agent": 0, "rounds": [[10, 2]]}'


def test_round_trip(tmp_path):
    trajs = (
        Trajectory(0, (TurnSpec(6000, 90), TurnSpec(0, 1), TurnSpec(250, 180))),
        Trajectory(7, (TurnSpec(5, 3),), arrival_s=12.5),
    )
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajs)
    assert path.read_text().splitlines() == [
        '{"agent":0,"rounds":[[6000,90],[0,1],[250,180]]}',
        '{"agent":7,"rounds":[[5,3]],"arrival_s":12.5}',
    ]
    back = read_trajectories(path)
    assert back == trajs
    assert back[1].arrival_s == 12.5 and back[0].arrival_s is None


def test_tool_time_round_trip(tmp_path):
    """A round's wait is its third number, written only where it is not 0; rounds without one read as 0."""
    trajs = (Trajectory(0, (TurnSpec(600, 9), TurnSpec(20, 3, 2.5), TurnSpec(7, 1))),)
    path = tmp_path / "t.jsonl"
    write_trajectories(path, trajs)
    assert path.read_text().splitlines() == ['{"agent":0,"rounds":[[600,9],[20,3,2.5],[7,1]]}']
    back = read_trajectories(path)
    assert back == trajs
    assert [t.wait_s for t in back[0].turns] == [0.0, 2.5, 0.0]


def test_blank_lines_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + GOOD + "\n\n" + '{"agent": 1, "rounds": [[0, 1]], "arrival_s": 3}' + "\n")
    got = read_trajectories(path)
    assert [t.agent for t in got] == [0, 1]
    assert got[1].arrival_s == 3.0


@pytest.mark.parametrize(
    "bad, problem",
    [
        ('{"agent": 1, "rounds": [[1, 2]]', "bad JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"rounds": [[1, 2]]}', "missing key(s) agent"),
        ('{"agent": 1}', "missing key(s) rounds"),
        ('{"agent": 1, "rounds": [[1, 2]], "arival_s": 1}', "unknown key(s) arival_s"),
        ('{"agent": "1", "rounds": [[1, 2]]}', "agent must be an integer"),
        ('{"agent": -1, "rounds": [[1, 2]]}', "agent must be >= 0"),
        ('{"agent": 1, "rounds": []}', "rounds must be a non-empty list"),
        ('{"agent": 1, "rounds": [[1, 2, 3, 4]]}', "round 0 must be [append_tokens, gen_tokens]"),
        ('{"agent": 1, "rounds": [[1, 2, 3]]}', "round 0 has no wait"),
        ('{"agent": 1, "rounds": [[1, 2], [1, 2, -1]]}', "round 1 wait_s must be a finite number >= 0"),
        ('{"agent": 1, "rounds": [[1, 2], [1, 2, "later"]]}', "round 1 wait_s must be a finite number >= 0"),
        ('{"agent": 1, "rounds": [[1, 2], 5]}', "round 1 must be [append_tokens, gen_tokens]"),
        ('{"agent": 1, "rounds": [[-1, 2]]}', "round 0 append_tokens must be >= 0"),
        ('{"agent": 1, "rounds": [[1, 2], [1, 0]]}', "round 1 gen_tokens must be >= 1"),
        ('{"agent": 1, "rounds": [[1.5, 2]]}', "round 0 append_tokens must be an integer"),
        ('{"agent": 1, "rounds": [[true, 2]]}', "round 0 append_tokens must be an integer"),
        ('{"agent": 1, "rounds": [[1, 2]], "arrival_s": -2}', "arrival_s must be a finite number >= 0"),
        ('{"agent": 1, "rounds": [[1, 2]], "arrival_s": "soon"}', "arrival_s must be a finite number >= 0"),
        ('{"agent": 0, "rounds": [[1, 2]]}', "agent 0 already defined on line 1"),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, bad, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n\n" + bad + "\n")
    with pytest.raises(InputError) as err:
        read_trajectories(path)
    msg = str(err.value)
    assert msg.startswith(f"{path} line 3: ")
    assert problem in msg


def test_empty_and_missing_files(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match="no trajectories"):
        read_trajectories(empty)
    with pytest.raises(InputError, match="cannot read trajectory file"):
        read_trajectories(tmp_path / "nope.jsonl")
