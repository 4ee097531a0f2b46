"""One run's timeline: spans and instants on named tracks, written as Chrome trace events (the
JSON Object Format: `{"traceEvents": [...]}`), so that a run opens in Perfetto (ui.perfetto.dev)
or chrome://tracing. Both worlds use the same tracks and names, so a simulated run and a real one
can be laid side by side in one file (`merge_traces`).

Tracks (a thread each, in a process per world and role: "sim prefill", "runtime storage", ...):
  `PE<i>`, `DE<j>`                  an engine, numbered within its role in id order (as the
                                    decision log numbers them, metrics/decisions.py)
  `CNIC PE<i>`, `CNIC DE<j>`        the engine's CNIC (the runtime's arbiter)
  `SNIC node<n> read` / `... write` a node's SNIC per direction (the simulator's node ids; the
                                    runtime's node n is engine n)
  `router`                          placement and first tokens
A track whose spans overlap (a link's flows, a node's reads) is split into lanes at export,
`<track> (2)` and so on, since the format nests the spans of one thread and cannot overlap them.

Spans (SPAN_NAMES; args `requests`: the names of the requests a span concerns, `a3t1` as in
metrics/decisions.py):
  read      storage -> host buffer, one read job (the read side's SNIC read track)
  h2d       host buffer -> HBM: a DE's prompt into its KV cache (CNIC DE), or a PE-path forward's
            cached KV into the PE (CNIC PE)
  prefill   one forward of a PE (its engine track; args `tokens`: tokens computed)
  transfer  args `direction`: "PE->DE", a forward's new KV (PE path: and the hit) to the DE buffer
            (CNIC PE); "DE->PE", a forward's layer stream of the DE read path (CNIC DE; the paper
            presets' one incast flow per PE GPU: CNIC PE)
  decode    one step of a DE (its engine track; args `batch`: sequences in the step)
  persist   one block written to storage (SNIC write track; args `wait_s`: since its copy out of
            HBM handed it to the node's writer)
  d2h       HBM -> host: a DE's full block copied out of its KV cache to persist (CNIC DE; the
            runtime's and the `local` preset's only, COPY_OUT_SPANS)
Instants (INSTANT_NAMES) on `router`: `placed` (args `hit_tokens`, `side`), `first_token`.

Times are seconds on the world's clock and are written relative to the run's start (`t0_s`): the
simulator's t = 0, the runtime's CLOCK_MONOTONIC when the replay began (the decision log's t0).
Runtime engines record with their own MonotonicClock (runtime/clock.py) and send their spans to the
router with their `Counters`, which merges them (router/metrics.py). The processes of one host share
CLOCK_MONOTONIC (a LocalCluster's engines; the testbed's namespaces, which are one kernel), so
their spans line up exactly. Engines on other hosts (Ray actors, `dualpath engine` elsewhere) are
NOT aligned: their spans are off by the difference of the two hosts' monotonic clocks.

Off, a world holds NULL_TIMELINE, chosen once (the simulator's SimContext, an engine's constructor,
the router's metrics): its methods do nothing and read no clock, and no code asks whether
recording is on.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

SPAN_NAMES = ("read", "h2d", "prefill", "transfer", "decode", "persist", "d2h")
# the DE's copy of a full block out of its cache before a persist: the runtime's and the `local`
# preset's (its copies cross the DE's arbiter, sim/persists.py); the paper presets do not time it
COPY_OUT_SPANS = ("d2h",)
INSTANT_NAMES = ("placed", "first_token")
ROUTER = "router"
SIDES = ("prefill", "decode")  # a `placed` instant's side, by ReadSide value (as metrics/decisions.py)
PE_TO_DE, DE_TO_PE = {"direction": "PE->DE"}, {"direction": "DE->PE"}  # a `transfer`'s args (copied at export)
WORLDS = ("sim", "runtime")
_ROLES = ("router", "prefill", "decode", "storage", "other")
_EPS_STEPS = 1e-9  # as sim/decode.py: progress within this of a whole step has reached it
_LANE = re.compile(r"^(.*) \((\d+)\)$")


def _resolve(args: Any) -> Any:
    """A span's args: a dict, None, or a function that makes the dict (called only when recording)."""
    return args() if callable(args) else args


class Timeline:
    """Records spans and instants; `clock`: the runtime's seconds (`now_s`, `begin`/`end`, `mark`)."""

    def __init__(self, t0_s: float = 0.0, clock: Optional[Callable[[], float]] = None) -> None:
        self.t0_s = t0_s
        self._clock = clock
        self.spans: list[list[Any]] = []  # [track, name, start_s, end_s, request or None, args or None]
        self.instants: list[list[Any]] = []  # [track, name, t_s, request or None, args or None]
        self.names: dict[Any, str] = {}  # request id -> its name (the runtime's ids are ints)
        self._open: dict[Any, float] = {}  # begun spans by key: start_s
        self._steps: list[Steps] = []

    def span(self, track: str, name: str, start_s: float, end_s: float, request: Any = None, args: Any = None) -> None:
        self.spans.append([track, name, start_s, end_s, request, _resolve(args)])

    def instant(self, track: str, name: str, t_s: float, request: Any = None, args: Any = None) -> None:
        self.instants.append([track, name, t_s, request, _resolve(args)])

    def name(self, request: Any, text: str) -> None:
        self.names[request] = text

    # --- the runtime's: spans timed by the clock -----------------------------------------------------
    def now_s(self) -> float:
        assert self._clock is not None, "a timeline without a clock is given its times"
        return self._clock()

    def until_now(self, track: str, name: str, start_s: float, request: Any = None, args: Any = None) -> None:
        self.span(track, name, start_s, self.now_s(), request, args)

    def mark(self, track: str, name: str, request: Any = None, args: Any = None) -> None:
        self.instant(track, name, self.now_s(), request, args)

    def begin(self, key: Any) -> None:
        """A span starts now (the first `begin` of a key holds until its `end`; any thread)."""
        if key not in self._open:
            self._open[key] = self.now_s()

    def end(self, key: Any, track: str, name: str, request: Any = None, args: Any = None) -> None:
        """The span begun under `key` ends now (nothing when none was begun)."""
        start_s = self._open.pop(key, None)
        if start_s is not None:
            self.until_now(track, name, start_s, request, args)

    def drain(self) -> list[list[Any]]:
        """The spans recorded since the last drain (an engine's, for its next Counters). Safe
        against spans appended meanwhile by other threads: only what was taken is removed."""
        n = len(self.spans)
        out = self.spans[:n]
        del self.spans[:n]
        return out

    def add(self, spans: Any) -> None:
        """Spans another process drained (the router takes its engines')."""
        self.spans.extend(list(s) for s in spans)

    def steps(self, tracks: list[str], name: str) -> "Steps":
        s = Steps(self, tracks, name)
        self._steps.append(s)
        return s

    # --- export ----------------------------------------------------------------------------------------
    def to_chrome(self, world: str) -> dict[str, Any]:
        """The Chrome trace of this timeline as world `world` ("sim" or "runtime")."""
        if world not in WORLDS:
            raise ValueError(f"world must be one of {WORLDS}, got {world!r}")
        for s in self._steps:
            s.close()
        lanes = _lanes(self.spans)
        threads = sorted({(s[0], lane) for s, lane in zip(self.spans, lanes)} | {(i[0], 0) for i in self.instants},
                         key=lambda t: (_natural(t[0]), t[1]))
        base = 100 * (WORLDS.index(world) + 1)
        tid: dict[tuple[str, int], tuple[int, int]] = {}
        meta: list[dict[str, Any]] = []
        for track, lane in threads:
            pid = base + _ROLES.index(_role(track))
            if not any(m["pid"] == pid for m in meta):
                meta += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{world} {_role(track)}"}},
                         {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
            t = tid[(track, lane)] = (pid, 1 + sum(1 for p, _ in tid.values() if p == pid))
            meta += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t[1],
                      "args": {"name": track if lane == 0 else f"{track} ({lane + 1})"}},
                     {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t[1], "args": {"sort_index": t[1]}}]
        events = [self._event(world, tid[(s[0], lane)], "X", s[1], s[2], s[4], s[5], s[3]) for s, lane in zip(self.spans, lanes)]
        events += [self._event(world, tid[(i[0], 0)], "i", i[1], i[2], i[3], i[4]) for i in self.instants]
        events.sort(key=lambda e: (e["ts"], e["pid"], e["tid"], e["name"]))
        return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": {"worlds": [world]}}

    def _event(self, world: str, where: tuple[int, int], ph: str, name: str, t_s: float, request: Any, args: Any,
               end_s: float | None = None) -> dict[str, Any]:
        out = dict(args or {})
        if request is not None:
            out["requests"] = [request]
        if "requests" in out:
            out["requests"] = [self.names.get(r) or str(r) for r in out["requests"]]
        e = {"ph": ph, "name": name, "cat": world, "pid": where[0], "tid": where[1], "ts": _us(t_s - self.t0_s), "args": out}
        if end_s is None:
            e["s"] = "t"
        else:
            e["dur"] = _us(max(0.0, end_s - t_s))
        return e


class NullTimeline(Timeline):
    """Recording off: every method does nothing (and reads no clock)."""

    def span(self, track: str, name: str, start_s: float, end_s: float, request: Any = None, args: Any = None) -> None:
        pass

    def instant(self, track: str, name: str, t_s: float, request: Any = None, args: Any = None) -> None:
        pass

    def name(self, request: Any, text: str) -> None:
        pass

    def now_s(self) -> float:
        return 0.0

    def until_now(self, track: str, name: str, start_s: float, request: Any = None, args: Any = None) -> None:
        pass

    def mark(self, track: str, name: str, request: Any = None, args: Any = None) -> None:
        pass

    def begin(self, key: Any) -> None:
        pass

    def end(self, key: Any, track: str, name: str, request: Any = None, args: Any = None) -> None:
        pass

    def drain(self) -> list[list[Any]]:
        return []

    def add(self, spans: Any) -> None:
        pass

    def steps(self, tracks: list[str], name: str) -> "Steps":
        return NullSteps(self, tracks, name)


class Steps:
    """A group's steps as spans when its progress is fluid (the simulator's DE group, sim/decode.py):
    told each stretch [t0_s, t1_s] over which its progress went from p0 to p1 steps at `step_s`
    seconds a step, it ends a step wherever progress crosses a whole number, one span per track
    with that track's args (`args()`: a dict per track, the stretch's batch). A stretch that does
    not continue the last one (the group was idle in between, its progress rounded up) first ends
    the step in progress where the last stretch ended."""

    def __init__(self, timeline: Timeline, tracks: list[str], name: str) -> None:
        self._tl = timeline
        self.tracks = tracks
        self.name = name
        self._start_s = -1.0  # the running step's start; -1: none
        self._next_p = 0.0  # the progress at which it ends
        self._end_s = -1.0  # where the last stretch ended
        self._end_p = -1.0
        self._args: list[Any] = []

    def advance(self, t0_s: float, t1_s: float, p0: float, p1: float, step_s: float, args: Callable[[], list[Any]]) -> None:
        if t0_s != self._end_s or p0 != self._end_p:
            self.close()
            self._start_s = t0_s
            self._next_p = math.floor(p0 + _EPS_STEPS) + 1.0
        per_track = args()
        while self._next_p <= p1 + _EPS_STEPS:
            t_s = min(t1_s, t0_s + (self._next_p - p0) * step_s)
            self._emit(t_s, per_track)
            self._start_s = t_s
            self._next_p += 1.0
        self._end_s, self._end_p, self._args = t1_s, p1, per_track

    def close(self) -> None:
        """The step in progress ends where the last stretch ended (the group went idle mid-step)."""
        if 0 <= self._start_s < self._end_s:
            self._emit(self._end_s, self._args)
        self._start_s = -1.0

    def _emit(self, end_s: float, per_track: list[Any]) -> None:
        for track, args in zip(self.tracks, per_track):
            self._tl.span(track, self.name, self._start_s, end_s, None, args)


class NullSteps(Steps):
    def advance(self, t0_s: float, t1_s: float, p0: float, p1: float, step_s: float, args: Callable[[], list[Any]]) -> None:
        pass

    def close(self) -> None:
        pass


NULL_TIMELINE = NullTimeline()


def engine_tracks(prefill: bool, index: int) -> tuple[str, str]:
    """(engine, its CNIC): the tracks of the `index`-th engine of its role, named alike in both worlds."""
    engine = f"{'PE' if prefill else 'DE'}{index}"
    return engine, f"CNIC {engine}"


def snic_tracks(node: int) -> tuple[str, str]:
    """(read, write): the tracks of a node's SNIC."""
    return f"SNIC node{node} read", f"SNIC node{node} write"


def _lanes(spans: list[list[Any]]) -> list[int]:
    """Per span, its lane within its track: the first lane free at its start (greedy, by start)."""
    out = [0] * len(spans)
    free_at: dict[str, list[float]] = {}
    for i in sorted(range(len(spans)), key=lambda k: (spans[k][2], spans[k][3], k)):
        track, start_s, end_s = spans[i][0], spans[i][2], spans[i][3]
        ends = free_at.setdefault(track, [])
        lane = next((n for n, e in enumerate(ends) if e <= start_s), len(ends))
        if lane == len(ends):
            ends.append(end_s)
        ends[lane] = max(end_s, start_s)
        out[i] = lane
    return out


def _role(track: str) -> str:
    if track == ROUTER:
        return "router"
    if track.startswith("SNIC"):
        return "storage"
    engine = track.split()[-1]
    return "prefill" if engine.startswith("PE") else "decode" if engine.startswith("DE") else "other"


def _natural(text: str) -> tuple:
    """`PE2` before `PE10`."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


# --- files and reading back --------------------------------------------------------------------------
def timeline_path(base: str | Path, mode: str) -> Path:
    """Where `--timeline BASE` writes one mode's trace: `out/t.json` -> `out/t.<mode>.json`."""
    base = Path(base)
    return base.with_name(f"{base.stem}.{mode}{base.suffix or '.json'}")


def write_trace(trace: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    return path


def merge_traces(*traces: dict[str, Any]) -> dict[str, Any]:
    """Several worlds' traces in one file (each world has its own processes); one trace per world."""
    worlds = [w for t in traces for w in t.get("otherData", {}).get("worlds", [])]
    if len(set(worlds)) != len(worlds):
        raise ValueError(f"one trace per world, got {worlds}")
    return {"traceEvents": [e for t in traces for e in t["traceEvents"]], "displayTimeUnit": "ms",
            "otherData": {"worlds": worlds}}


@dataclass(frozen=True, slots=True)
class Span:
    """A span or instant of a trace, read back (`read_trace`); an instant's end is its start."""

    world: str
    track: str
    name: str
    start_s: float
    end_s: float
    requests: tuple[str, ...]
    args: dict


def read_trace(trace: dict[str, Any]) -> tuple[list[Span], list[Span]]:
    """(spans, instants) of a trace this module wrote, with their tracks (lanes joined again),
    seconds from the run's start, in time order."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans: list[Span] = []
    instants: list[Span] = []
    for e in trace["traceEvents"]:
        if e["ph"] not in ("X", "i"):
            continue
        thread = names[(e["pid"], e["tid"])]
        lane = _LANE.match(thread)
        args = dict(e["args"])
        start_s = e["ts"] / 1e6
        s = Span(e["cat"], lane.group(1) if lane else thread, e["name"], start_s, start_s + e.get("dur", 0.0) / 1e6,
                 tuple(args.pop("requests", ())), args)
        (spans if e["ph"] == "X" else instants).append(s)
    return spans, instants
