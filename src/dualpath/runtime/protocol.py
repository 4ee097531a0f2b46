"""Control messages between the router and the engine processes (msgpack over ZeroMQ).

Bulk KV bytes never ride here: they move through shared memory (`transport.shm`) on a link's
arbiter. Request ids are ints (the router's counter); token ids are lists of ints.

Host buffers (one shared-memory segment per node, slots of one Full Block) are allocated by the
router, which therefore knows every buffer's occupancy, as the paper's scheduler does.

Numbered path of one request (router R, prefill engine P, decode engine D):
  1. R -> D `DecodeAssign` with the DE-buffer region for the prompt: D reserves HBM (KV cache
     blocks); on the DE path it reads the hit blocks into the region, then D -> P `HitReady`.
  2. R -> P `PrefillAssign`: on the PE path P reads the hit into its PE-buffer region (a split
     read: P its prefix, `pe_part_tokens`, D the rest, both at once).
  3. P runs layerwise prefill; per layer, cached KV lands in P's landing zone (PE path: P copies
     from its buffer; DE path: P -> D `LayerPull`, D copies, D -> P `LayerReady`), and the layer's
     new KV (plus, on the PE path, the hit) is written into D's region.
  4. P -> R `FirstToken`; P -> D `PromptReady` once every PD byte has landed.
  5. D copies the prompt into its KV cache (H2D), D -> R `PromptLoaded` (the region is freed),
     decodes; D -> R `Token` per token, the last one `finished`; D persists every full block,
     announcing each (`PersistQueued`) before the token that follows it and reporting the write
     (`Persisted`), so the next turn's lookup never misses a block still being written.
  6. R -> P/D `Cancel` frees a request early (client gone, or its other engine died).
A request prefilled on its DE (+selective) has no PE: R -> D `DecodeAssign` with `local`; D reads
the hit (or, with `read_side` PREFILL, R -> P `RelayAssign`: P reads it into its buffer, writes it
into D's region, P -> D `HitReady` with the write's sums, P -> R `RelayDone`), computes the rest of
the prompt, D -> R `FirstToken`, then 5.
Engines report loads with every state change they own (`EngineReport`), and with `+dram` their
DRAM tier's changes after each read job and persist (`DramChanged`). Every engine sends a
`Heartbeat` from a thread of its own; when the router fences a dead or silent engine it tells
the others (`EngineDown`), so none waits for that engine's reply (router/liveness.py). A joined
engine that restarts (a Ray actor, deploy/ray/engines.py) asks for its place again; the
router re-admits it under the next incarnation and tells the others (`EngineUp`, router/membership.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .transport.messages import message


class EngineRole(enum.StrEnum):
    """What an engine process is (a str, so it travels in messages as its value)."""

    PREFILL = "prefill"
    DECODE = "decode"


@message
@dataclass(frozen=True, slots=True)
class Hello:
    """Engine -> router at start: who it is and what it holds."""

    engine: int
    role: EngineRole  # arrives as its str value
    endpoint: str
    kv_capacity_tokens: int  # DE: KV cache (HBM) size; PE: 0
    buffer_bytes: int
    prefill_tokens_per_s: float  # measured at start (PE), 0 for DE
    attn_flops_per_s: float  # measured attention rate (PE), for the compute quota
    buffer_segment: str = ""  # the node's host buffer: its segment name and Full Block slots, from
    buffer_slots: int = 0  # which the router's ledger (SlotLedger) for this node is built
    data_endpoint: str = ""  # HOST:PORT of its WriteTarget (transport.kind tcp; engine/peers.py)


@message
@dataclass(frozen=True, slots=True)
class PrefillAssign:
    rid: int
    prompt_ids: list
    hit_tokens: int
    hit_digests: list  # bytes, one per hit block, in order
    read_side: int  # core.snapshot.ReadSide
    de_engine: int
    de_endpoint: str
    de_segment: str
    de_data: str  # the DE's data endpoint for remote writes ("" on one host: engine/peers.py)
    de_offsets: list  # one slot offset per prompt block (ceil(prompt / block_tokens))
    pe_offsets: list  # PE-buffer slots (PE path); empty on the DE path
    temperature: float
    top_p: float
    seed: int
    suppress_eos: bool  # min_tokens > 0 or ignore_eos: the first token may not be EOS
    layerwise: bool
    logprobs: int = -1  # SamplingParams.logprobs: top logprobs per token; -1 (api.NO_LOGPROBS): none
    n: int = 1  # SamplingParams.n: each choice's first token is sampled here (model/generate.py: choice_seed)
    pe_part_tokens: int = 0  # a split read (read_side DECODE): the hit's prefix P reads into pe_offsets; D the rest


@message
@dataclass(frozen=True, slots=True)
class DecodeAssign:
    rid: int
    prompt_ids: list
    hit_tokens: int
    hit_digests: list
    read_side: int
    pe_endpoint: str
    de_offsets: list
    root_digest: bytes  # block 0's parent: the request's cache salt (core/blocks.py: salted_root)
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    temperature: float
    top_p: float
    seed: int
    logprobs: int = -1  # as PrefillAssign's
    n: int = 1  # choices: each decodes here from the prompt's KV blocks, shared (PagedKVCache.fork)
    pe_part_tokens: int = 0  # a split read: D reads hit tokens [pe_part_tokens, hit_tokens) (PrefillAssign's)
    local: bool = False  # +selective: no PE; D reads the hit, prefills the rest itself and sends FirstToken


@message
@dataclass(frozen=True, slots=True)
class PromptLoaded:
    """D -> R: the prompt's KV is in D's KV cache; its DE-buffer region may be freed. It repeats
    the first token (from `PromptReady`), so the stream has token 0 even if the PE's `FirstToken`
    never arrives (the PE killed with it still queued, after its `PromptReady` went out)."""

    rid: int
    first_token: int
    cached_tokens: int
    logprobs: list = field(default_factory=list)  # the first token's, from PromptReady
    more: list = field(default_factory=list)  # choices 1..n-1: [first token, its logprobs on the wire]


@message
@dataclass(frozen=True, slots=True)
class HitReady:
    """D -> P (DE path): the hit blocks are in D's region; P may prefill. P -> D (a relay,
    +selective): the same of D's region, with the sums of P's write into it."""

    rid: int
    ok_blocks: int  # blocks read and verified; fewer than asked means a checksum failure
    sums: list = field(default_factory=list)  # a relay's write (transport/integrity.py); [] otherwise


@message
@dataclass(frozen=True, slots=True)
class RelayAssign:
    """R -> P (+selective with DualPath's read-side rule): read the hit blocks of a request that
    its DE prefills into `pe_offsets` of this node's buffer, then write them into the DE's region
    (`de_offsets`); `HitReady` to the DE, `RelayDone` to R."""

    rid: int
    hit_digests: list
    pe_offsets: list
    de_engine: int
    de_endpoint: str
    de_segment: str
    de_data: str
    de_offsets: list


@message
@dataclass(frozen=True, slots=True)
class RelayDone:
    """P -> R: a relay ended (its buffer slots may be freed); after its ReadDone."""

    rid: int
    engine: int


@message
@dataclass(frozen=True, slots=True)
class LayerPull:
    """P -> D: copy layer `layer` of tokens [first_token, num_tokens) of `rid` into P's landing zone,
    whose tokens [0, num_tokens) start at `offset_bytes`."""

    rid: int
    layer: int
    num_tokens: int
    segment: str
    offset_bytes: int
    reply_to: str
    reply_data: str  # the PE's data endpoint for remote writes ("" on one host: engine/peers.py)
    first_token: int = 0  # a split read: tokens before it are the PE's own part (P loads them itself)


@message
@dataclass(frozen=True, slots=True)
class LayerDropped:
    """D -> P: D had already let `rid` go (cancelled) when its `LayerPull` for `layer` came, so no
    bytes come; P stops waiting for that load (the item's outputs are discarded: P is cancelling it
    too). Every pull is answered once, by this or by `LayerReady`, so no write lands late."""

    rid: int
    layer: int


@message
@dataclass(frozen=True, slots=True)
class LayerReady:
    """D -> P (DE path; P -> P on the PE path): layer `layer` of `rid` has landed. `sums`: the
    sender's checksums of what it sent, relative to the item's landing offset (transport/integrity.py)."""

    rid: int
    layer: int
    sums: list
    own: bool = False  # P's copy from its own buffer (the PE path's, or a split read's PE part); else D's


@message
@dataclass(frozen=True, slots=True)
class PromptReady:
    """P -> D: every byte of the prompt's KV is in D's region; the first token was sampled.
    `hit_tokens` is the hit that was used (less than assigned if a block failed its checksum)."""

    rid: int
    first_token: int
    hit_tokens: int
    pd_sums: list  # the PE's checksums of every piece it wrote into D's buffer (transport/integrity.py)
    logprobs: list = field(default_factory=list)  # api.TokenLogprobs.to_wire(); []: not asked for
    more: list = field(default_factory=list)  # choices 1..n-1: [first token, its logprobs on the wire]


@message
@dataclass(frozen=True, slots=True)
class FirstToken:
    rid: int
    token: int
    cached_tokens: int
    logprobs: list = field(default_factory=list)  # api.TokenLogprobs.to_wire(); []: not asked for
    more: list = field(default_factory=list)  # choices 1..n-1: [first token, its logprobs on the wire]


@message
@dataclass(frozen=True, slots=True)
class Token:
    rid: int
    token: int
    index: int
    finished: bool
    reason: str  # "" while running, "stop" or "length"
    logprobs: list = field(default_factory=list)  # api.TokenLogprobs.to_wire(); []: not asked for
    choice: int = 0  # which of the request's n choices


@message
@dataclass(frozen=True, slots=True)
class ReadDone:
    """Engine -> R: a storage read finished on this engine's node (the read queue shrinks)."""

    rid: int
    engine: int
    tokens: int
    nbytes: int
    ok_blocks: int


@message
@dataclass(frozen=True, slots=True)
class PrefillDone:
    """P -> R: the request left the PE (its tok/seq load ends)."""

    rid: int
    engine: int


@message
@dataclass(frozen=True, slots=True)
class DecodeDone:
    """D -> R: the request left the DE (HBM and load freed)."""

    rid: int
    engine: int


@message
@dataclass(frozen=True, slots=True)
class PersistQueued:
    """D -> R: these Full Blocks are on their way to storage. Sent before the token that makes them
    visible to the client (so before the client can send its next turn): a lookup that meets one of
    them waits for its `Persisted` instead of recomputing it."""

    engine: int
    digests: list  # bytes, chained block digests


@message
@dataclass(frozen=True, slots=True)
class Persisted:
    """D -> R: the write of one queued block ended; `stored` False if it failed (e.g. no space):
    the waiting lookup then counts it as a miss."""

    engine: int
    digest: bytes
    stored: bool


@message
@dataclass(frozen=True, slots=True)
class DramChanged:
    """Engine -> R (`+dram`): what the engine node's DRAM tier came to hold and dropped since its last
    report (store/dram_tier.py `drain_changes`), in the order the tier changed: the router's copy of
    the tier (router/dram_index.py) applies `dropped`, then `held`."""

    engine: int
    held: list  # bytes, block digests
    dropped: list  # bytes, block digests


@message
@dataclass(frozen=True, slots=True)
class Cancel:
    rid: int


@message
@dataclass(frozen=True, slots=True)
class Counters:
    """Engine -> R, periodically and at shutdown: cumulative byte counters."""

    engine: int
    storage_read_bytes: int
    storage_write_bytes: int
    read_busy_s: float  # time the node's storage reader had a read queued or running
    cnic_kv_bytes: int
    cnic_lc_bytes: int
    busy_s: float
    forwards: int
    # transfer integrity (transport/integrity.py): pieces that failed their checksum, by path
    layer_checksum_failures: int = 0  # found by this PE in its landing zone
    layer_retransmits: int = 0  # layer loads this PE asked again after a mismatch
    pd_checksum_failures: int = 0  # found by this DE in its region
    kv_recomputes: int = 0  # requests whose KV this engine recomputed instead of using bad bytes
    kv_flips_injected: int = 0  # fault injection: bits this engine flipped in what it sent
    # the node's store latency as this engine's reader sees it: an EWMA (READ_LATENCY_EWMA_WEIGHT)
    # of the seconds a read job's first block takes, its SNIC wait excluded; 0 before any read
    read_latency_s: float = 0.0
    remote_write_bytes: int = 0  # KV bytes this engine wrote into peers over TCP (engine/peers.py)
    dram_read_bytes: int = 0  # hit bytes its node's reads took from its DRAM tier, not the SNIC (`+dram`)
    # calls of this engine's storage-service client answered without the service while its circuit
    # breaker was open (store/breaker.py): reads taken as misses, persists skipped; 0 for a local store
    store_skipped_calls: int = 0
    forward_items: int = 0  # summed over forwards: the requests (PE) or running sequences (DE) in each
    served_mid_step: int = 0  # DE: messages (layer pulls, finished reads and copies) served between a step's layers
    # summed over forwards, the terms of the compute profile's fit (runtime/profile/calibrate.py)
    # besides its fixed one (`forwards`): prefill (new tokens, 0, causal keys), decode (sequences,
    # longest context, sequences x longest context). `busy_s` over the profile's prediction from
    # them is the engine's compute speed during the run (fidelity/speed.py)
    fit_terms: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # link time this engine's CNIC arbiter lost because its thread fell behind the link's schedule
    # (the host could not copy at the emulated rate then, e.g. its cores were computing; arbiter.py)
    cnic_stalled_s: float = 0.0
    # the encoded bytes of this engine's messages to the router and to other engines (its control
    # plane: tokens, heartbeats, counters, layer pulls), this report not included; what a kernel
    # counts on the node's CNIC besides the KV (deploy/testbed/demo.py:ledger_vs_kernel)
    control_bytes: int = 0
    # the engine's timeline spans since its last Counters (RuntimeConfig.record_timeline), each
    # [track, name, start_s, end_s, rid or None, args or None] on its CLOCK_MONOTONIC (metrics/timeline.py)
    spans: list = field(default_factory=list)
    # the engine's last report: sent as it stops, once its writer has drained (engine/storage.py
    # `stop`); the cluster's shutdown waits for it (runtime/cluster.py `_final_reports`)
    final: bool = False


# Counters' transfer-integrity fields, in order (engines fill them, the router's metrics sum them)
INTEGRITY_COUNTERS = ("layer_checksum_failures", "layer_retransmits", "pd_checksum_failures", "kv_recomputes",
                      "kv_flips_injected")


@message
@dataclass(frozen=True, slots=True)
class Reconfigure:
    """R -> engines, only while no request is in flight: switch mode and KV store directory (lets one
    cluster run several modes on fresh stores without restarting the engine processes)."""

    mode: str
    store_root: str


@message
@dataclass(frozen=True, slots=True)
class Reconfigured:
    engine: int
    mode: str


# Beats per heartbeat timeout (RuntimeConfig.faults.heartbeat_timeout_s): a timeout is 5 missed
# beats, so one late beat (a busy CPU) never fences an engine.
HEARTBEATS_PER_TIMEOUT = 5


@message
@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Engine -> R every heartbeat interval, from the engine's heartbeat thread: still alive."""

    engine: int


@message
@dataclass(frozen=True, slots=True)
class Leaving:
    """Engine -> R, from an engine told to end (SIGTERM): fence me now and move my requests, rather
    than after a heartbeat timeout (what an engine on another host costs without it)."""

    engine: int
    incarnation: int = 0  # which holder of the place is leaving (a stale one's is ignored)


@message
@dataclass(frozen=True, slots=True)
class EngineDown:
    """R -> surviving engines: `engine` is fenced (dead or frozen, and killed); stop waiting for it."""

    engine: int
    incarnation: int = 0  # the fenced process (wire.py): its remote writes are refused from now on


@message
@dataclass(frozen=True, slots=True)
class EngineUp:
    """R -> the other engines: a successor holds `engine`'s place again (its `incarnation`, one the
    remote-write fence still accepts); it may be assigned work and waited for once more."""

    engine: int
    incarnation: int


@message
@dataclass(frozen=True, slots=True)
class Join:
    """An engine started on its own (`dualpath engine`) -> the router: take me as a `role` engine;
    answer at `reply_to` (engine/join.py)."""

    role: EngineRole  # arrives as its str value
    reply_to: str
    host: str  # the engine's host name, for errors and logs
    engine: int = -1  # the place it asks for (a restarted engine: its own); -1 = any free one


@message
@dataclass(frozen=True, slots=True)
class Welcome:
    """Router -> a joining engine: its engine id and the cluster's config (JSON of RuntimeConfig),
    store and model fingerprint; `refused` names why it was not taken ("" = taken)."""

    engine: int
    config_json: str
    store_root: str
    fingerprint: str
    router_endpoint: str
    full_block_bytes: int  # a host-buffer slot: one Full Block of the model (all layers)
    refused: str
    incarnation: int = 0  # which holder of `engine` this is: 0 first, +1 per re-admission (router/membership.py)
