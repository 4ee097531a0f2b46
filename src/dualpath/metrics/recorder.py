"""Per-turn timestamps, recorded once per finished turn (columns, not objects: cheap to keep
hundreds of thousands of rows).

Definitions (both worlds):
- TTFT = first token - arrival. The first token is sampled at the end of the last prefill chunk.
- TTST = second token - first token (PD transfer, H2D into DE HBM, first decode step).
- TPOT = (finish - second token) / (gen - 2), for turns that generate at least 3 tokens.
- JCT (offline) = time the last agent finishes; per agent: its finish - its arrival.
Breakdown of TTFT (docs/paper.md §6.4, Fig. 12): scheduling = arrival -> PE assigned (global queue);
allocation = PE assigned -> DE assigned with HBM reserved; read = wait in the read queue + the read;
prefill = ready -> first token (batch wait + forwards).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

TURN_CSV_COLUMNS = (
    "mode", "agent", "turn", "arrival_s", "sched_s", "alloc_s", "read_s", "batch_wait_s", "prefill_s", "first_s",
    "second_s", "finish_s", "input_tokens", "hit_tokens", "gen_tokens", "read_side", "pe_engine", "de_engine",
)


@dataclass(slots=True)
class TurnRecorder:
    agent: list[int] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    arrival_s: list[float] = field(default_factory=list)
    first_s: list[float] = field(default_factory=list)
    second_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    gen_tokens: list[int] = field(default_factory=list)
    input_tokens: list[int] = field(default_factory=list)
    hit_tokens: list[int] = field(default_factory=list)
    read_side: list[int] = field(default_factory=list)  # 0 = PE path, 1 = DE path (ReadSide)
    sched_s: list[float] = field(default_factory=list)
    alloc_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    prefill_s: list[float] = field(default_factory=list)
    batch_wait_s: list[float] = field(default_factory=list)  # ready -> its first forward starts (part of prefill_s)
    pe_engine: list[int] = field(default_factory=list)
    de_engine: list[int] = field(default_factory=list)

    def record(
        self, agent: int, turn: int, arrival_s: float, pe_assigned_s: float, assigned_s: float, read_end_s: float,
        prefill_start_s: float, first_s: float, second_s: float, finish_s: float, gen_tokens: int, input_tokens: int,
        hit_tokens: int, read_side: int, pe_engine: int, de_engine: int,
    ) -> None:
        if not arrival_s <= pe_assigned_s <= assigned_s <= read_end_s <= prefill_start_s <= first_s <= finish_s:
            raise AssertionError(
                f"timestamps out of order: arrival {arrival_s} assigned {assigned_s} read {read_end_s} "
                f"prefill start {prefill_start_s} first {first_s} finish {finish_s}"
            )
        self.agent.append(agent)
        self.turn.append(turn)
        self.arrival_s.append(arrival_s)
        self.first_s.append(first_s)
        self.second_s.append(second_s)
        self.finish_s.append(finish_s)
        self.gen_tokens.append(gen_tokens)
        self.input_tokens.append(input_tokens)
        self.hit_tokens.append(hit_tokens)
        self.read_side.append(read_side)
        self.sched_s.append(pe_assigned_s - arrival_s)
        self.alloc_s.append(assigned_s - pe_assigned_s)
        self.read_s.append(read_end_s - assigned_s)
        self.prefill_s.append(first_s - read_end_s)
        self.batch_wait_s.append(prefill_start_s - read_end_s)
        self.pe_engine.append(pe_engine)
        self.de_engine.append(de_engine)

    def write_csv(self, path: str | Path, mode: str, append: bool = False) -> None:
        """One row per finished turn, columns `TURN_CSV_COLUMNS` (durations in seconds, times since
        the run's start); `append` adds rows of another mode below an existing file's header."""
        with open(path, "a" if append else "w", newline="") as f:
            w = csv.writer(f)
            if not append:
                w.writerow(TURN_CSV_COLUMNS)
            cols = (self.agent, self.turn, self.arrival_s, self.sched_s, self.alloc_s, self.read_s, self.batch_wait_s,
                    self.prefill_s, self.first_s, self.second_s, self.finish_s, self.input_tokens, self.hit_tokens,
                    self.gen_tokens, self.read_side, self.pe_engine, self.de_engine)
            w.writerows((mode, *row) for row in zip(*cols))

    def __len__(self) -> int:
        return len(self.arrival_s)
