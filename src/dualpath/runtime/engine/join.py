"""An engine started on its own host (`dualpath engine`), joining a router over the network.

1. Bind a reply inbox on this host (tcp://LISTEN:0, authenticated with the shared token) and send
   `Join(role, reply_to, host)` to the router's endpoint; ZeroMQ reconnects, so the router may
   come up after the engine.
2. The router answers `Welcome`: the engine id it takes (or why it refused), the cluster's
   RuntimeConfig (the router's word on model, mode, rates and transport), the store URL and the
   model fingerprint the store checks.
3. The engine creates what lives on its node: the host buffer (and, a PE, its landing zone) in
   this host's shared memory, exposed to peers through its WriteTarget (engine/peers.py), then runs
   like an engine the local cluster started, and reports them in its Hello.
4. On exit it unlinks its segments. A killed engine leaves them to the resource tracker.

Local overrides (device, threads, tensor-parallel ranks) are this host's business and replace the router's.
"""

from __future__ import annotations

import os
import socket

from ...config import RuntimeConfig
from ...config.tp import TensorParallelConfig
from ...config.overrides import config_from_json, set_fields
from ...errors import InputError
from ..protocol import EngineRole, Join, Welcome
from ..store.remote import read_token
from ..transport.channel import Inbox, Outbox
from ..transport.shm import HostBuffer
from .base import EngineSpec
from .main import engine_main

JOIN_TIMEOUT_S = 120.0  # a router that is starting loads its model first: about a minute on a slow host


def join(router: str, role: str, token_file: str | None, listen_host: str = "127.0.0.1",
         timeout_s: float = JOIN_TIMEOUT_S, engine: int = -1) -> Welcome:
    """Ask `router` for a place as a `role` engine (`engine`: that place, e.g. a restarted one's
    own; -1 any); the Welcome, or an InputError saying why not."""
    try:
        engine_role = EngineRole(role)
    except ValueError:
        raise InputError(f"--role must be prefill or decode, got {role!r}") from None
    if not router.startswith("tcp://"):
        raise InputError(f"--router must be tcp://HOST:PORT, got {router!r}")
    token = None if token_file is None else read_token(token_file)
    try:
        inbox = Inbox(f"tcp://{listen_host}:0", token=token)
        out = Outbox(router, token=token, linger_s=0)
    except (ValueError, OSError) as exc:
        raise InputError(str(exc)) from None
    try:
        out.send(Join(engine_role, inbox.endpoint, socket.gethostname(), engine))
        msg = inbox.recv(timeout_s)
    finally:
        out.close()
        inbox.close()
    if not isinstance(msg, Welcome):
        raise InputError(f"no answer from the router at {router} within {timeout_s:.0f} s "
                         "(is it running, with the same --token-file, and reachable from this host?)")
    if msg.refused:
        raise InputError(f"the router at {router} refused this engine: {msg.refused}")
    return msg


def run_joined(welcome: Welcome, listen_host: str = "127.0.0.1", device: str | None = None,
               threads: int | None = None, store: str | None = None, tp: TensorParallelConfig | None = None) -> None:
    """Create this node's buffers and run the engine the Welcome describes, until it is stopped.
    `store`: this host's URL of the cluster's storage service (its own SNIC's address of it)."""
    cfg: RuntimeConfig = config_from_json(RuntimeConfig, welcome.config_json)
    local = {k: v for k, v in (("device", device), ("engines.torch_threads", threads), ("tp", tp)) if v is not None}
    cfg = set_fields(cfg, local)
    e = welcome.engine
    role = EngineRole.PREFILL if e < cfg.num_prefill else EngineRole.DECODE
    fbb = welcome.full_block_bytes
    buffer = HostBuffer.create(fbb, max(1, cfg.engines.host_buffer_bytes // fbb))
    landing = HostBuffer.create(cfg.engines.pe_hbm_bytes, 1) if role == EngineRole.PREFILL else None
    try:
        spec = EngineSpec(e, role, f"tcp://{listen_host}:0", welcome.router_endpoint, cfg,
                          {e: (buffer.name, buffer.slot_bytes * buffer.num_slots)},
                          (landing.name, cfg.engines.pe_hbm_bytes) if landing else (), store or welcome.store_root,
                          welcome.fingerprint, threads=cfg.engines.torch_threads or os.cpu_count() or 1,
                          incarnation=welcome.incarnation)
        engine_main(spec)
    finally:
        buffer.close()
        if landing is not None:
            landing.close()
