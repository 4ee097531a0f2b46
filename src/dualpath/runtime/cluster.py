"""A local PD-disaggregated cluster: one process per engine, the router in this process.

Start-up:
  1. the device is checked (runtime/engine/device.py); a private temporary directory for the control
     sockets (and the KV store unless configured; the oracle keeps its store in /dev/shm: "KV
     kept in memory");
  2. the model's tokenizer, shape and fingerprint (the store refuses blocks of another model);
  3. one host buffer per node (shared memory, Full Block slots, owned by the router) and one
     landing zone per prefill engine (its "HBM" for the batch's cached KV);
  4. the router, then the engine processes (forked from a forkserver with torch loaded, each pinned to its own CPU set where the
     machine has the cores: runtime/engine/cpus.py; each loads the model), then wait for every engine's
     `Hello`;
  5. an exit watch over the engine processes: an engine that dies is reported to the router at
     once, and one the router fences (frozen: no heartbeats) is killed (router/liveness.py).
Shutdown stops the watch and sends `Stop`; each engine lets its queued copies land and its writer drain
(engine/storage.py `stop`), reporting as it goes, then sends its final `Counters`, which the cluster
waits for from every engine it stopped, here or on another host (`_final_reports`), so the ledger
holds every persist; then it joins the processes and unlinks every segment.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..config import KvTransfer, RuntimeConfig
from ..config.overrides import config_to_json
from ..core.blocks import BlockLayout
from ..errors import InputError
from .clock import MonotonicClock
from .engine.cpus import available_cpus, plan_cpus
from .engine.device import require_device
from .engine.base import EngineSpec, kv_dtype
from .engine.main import engine_main
from .model import load_model
from .protocol import EngineRole, Join, Welcome
from .router.liveness import ExitWatch
from .router.router import Router
from .store import BlockStore
from .store.remote import RemoteStore, store_for
from .transport.channel import Outbox, ipc_endpoint
from .transport.messages import Stop
from .transport.mooncake import require_mooncake
from .transport.shm import HostBuffer


# Modules the engines' forkserver imports once, so that each engine process starts from a fork of
# it instead of a fresh interpreter importing torch: a tiny-model cluster's start fell from ~5.5 s
# to ~2 s and its stop from ~2.1 s to ~0.6 s (2-core VM, 3 starts each, 2026-12-01).
ENGINE_PRELOAD = ["torch", "dualpath.runtime.engine.main"]
# shutdown: a stopping engine reports its counters every 0.5 s while its writer drains (engine/storage.py
# STOP_REPORT_S); nothing from it for 10 s (20 periods: a loaded host's delays included) is an engine
# that will not report again. One whose process here has exited gets 2 s for its last report to arrive
FINAL_REPORT_STALL_S = 10.0
EXITED_REPORT_S = 2.0


def engine_context() -> Any:
    """The multiprocessing context engines start in: a forkserver with ENGINE_PRELOAD where the
    platform has one (a fork of a process that imported torch but never ran an op or touched CUDA),
    else spawn. A forked engine takes the cluster's environment from its spec (engine/main.py)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(ENGINE_PRELOAD)
    return ctx


class LocalCluster:
    def __init__(self, config: RuntimeConfig, start_timeout_s: float = 300.0, engines_listen: str | None = None,
                 on_router_ready: Callable[[str], None] | None = None) -> None:
        self.cfg = config
        self.start_timeout_s = start_timeout_s
        self.router: Router | None = None
        self._procs: list[Any] = []
        self.processes: dict[int, Any] = {}  # engine id -> its multiprocessing.Process (tests kill them)
        self._watch: ExitWatch | None = None
        self._buffers: dict[int, HostBuffer] = {}
        self._landing: dict[int, HostBuffer] = {}
        self._tmp: str | None = None
        self._store_tmp: str | None = None
        self._extra_stores: list[str] = []
        self.store: BlockStore | RemoteStore | None = None
        self.engines_listen = engines_listen  # tcp://HOST:PORT: engines join there instead of being spawned
        self.on_router_ready = on_router_ready  # called with the router's bound endpoint (port 0 resolved)
        self.on_fence: Callable[[int], None] | None = None  # also told of each fenced engine (Ray kills its actor)
        if engines_listen and config.transport.kind != "tcp":
            raise InputError("engines that join over the network need transport.kind tcp")
        engines = range(config.num_prefill + config.num_decode)
        self.cpu_plan = plan_cpus(engines, available_cpus(), config.engines.torch_threads)

    async def __aenter__(self) -> "LocalCluster":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        cfg = self.cfg
        require_device(cfg.device)  # one clear error here, not a traceback in every engine
        if cfg.transport.transfer is KvTransfer.MOONCAKE:
            require_mooncake()  # the same for the KV data plane's package
        self._tmp = tempfile.mkdtemp(prefix="dp-")
        if cfg.store.location:
            self._store_root = cfg.store.location
        else:
            base = "/dev/shm" if cfg.features.io_free and Path("/dev/shm").is_dir() else None
            self._store_tmp = tempfile.mkdtemp(prefix="dp-store-", dir=base)
            self._store_root = self._store_tmp
        loaded = load_model(cfg.model, device="cpu", seed=cfg.seed)
        mcfg, tokenizer = loaded.model.config, loaded.tokenizer
        del loaded
        if tokenizer is None:  # the router encodes prompts and decodes replies
            raise InputError(f"no tokenizer in {cfg.model} (no tokenizer.json): the cluster needs one")
        dtype = kv_dtype(cfg)
        tbpl = mcfg.kv_bytes_per_token_per_layer(dtype)
        layout, fingerprint = BlockLayout(mcfg.num_layers, cfg.block_tokens, tbpl), mcfg.fingerprint(dtype)
        self.store = store_for(self._store_root, layout, fingerprint, cfg.kv_dtype, capacity_bytes=cfg.store.capacity_bytes,
                               num_threads=1, timeout_s=cfg.store.timeout_s)
        self._layout, self._fingerprint = layout, fingerprint
        tcp = cfg.transport.kind == "tcp"  # loopback here, as engines on separate hosts would talk
        router_ep = self.engines_listen or ("tcp://127.0.0.1:0" if tcp else ipc_endpoint(self._tmp, "router"))
        self.router = Router(cfg, model_name=cfg.model, tokenizer=tokenizer, max_context_tokens=mcfg.max_position_tokens,
                             eos_token_ids=tuple(mcfg.eos_token_ids), kv_bytes_per_token=tbpl * mcfg.num_layers,
                             full_block_bytes=layout.full_block_bytes, store=self.store, endpoint=router_ep,
                             clock=MonotonicClock(), vocab_size=mcfg.vocab_size)
        self.router.start(asyncio.get_running_loop())
        if self.engines_listen:
            self.router.membership.on_join = self._welcome  # `dualpath engine`s join over the network (engine/join.py)
        else:
            self._spawn_engines()
        if self.on_router_ready is not None:  # e.g. start the engines that will join (Ray actors)
            self.on_router_ready(self.router.endpoint)
        loop = asyncio.get_running_loop()
        router = self.router
        self._watch = ExitWatch(self.processes, lambda e, cause: loop.call_soon_threadsafe(router.membership.engine_lost, e, cause))
        self._watch.start()
        router.membership.on_fence = self._kill
        try:
            await self.router.wait_ready(self.start_timeout_s)
        except Exception:
            await self.stop()
            raise

    def _spawn_engines(self) -> None:
        """One process per engine, with this node's buffers created here (one host)."""
        cfg, fbb = self.cfg, self._layout.full_block_bytes
        tcp = cfg.transport.kind == "tcp"
        engines = ([(e, EngineRole.PREFILL) for e in range(cfg.num_prefill)]
                   + [(cfg.num_prefill + d, EngineRole.DECODE) for d in range(cfg.num_decode)])
        for e, role in engines:
            self._buffers[e] = HostBuffer.create(fbb, max(1, cfg.engines.host_buffer_bytes // fbb))
            if role == EngineRole.PREFILL:
                self._landing[e] = HostBuffer.create(cfg.engines.pe_hbm_bytes, 1)
        segments = {e: (b.name, b.slot_bytes * b.num_slots) for e, b in self._buffers.items()}
        ctx, environ, plan = engine_context(), tuple(os.environ.items()), self.cpu_plan
        for e, role in engines:
            landing = (self._landing[e].name, cfg.engines.pe_hbm_bytes) if role == EngineRole.PREFILL else ()
            seen = {e: segments[e]} if tcp else segments  # across hosts an engine maps only its own node's buffer
            endpoint = "tcp://127.0.0.1:0" if tcp else ipc_endpoint(self._tmp, f"e{e}")
            spec = EngineSpec(e, role, endpoint, self.router.endpoint, cfg, seen, landing, self._store_root,
                              self._fingerprint, plan.cpus_by_engine[e], plan.threads_by_engine[e], environ)
            p = ctx.Process(target=engine_main, args=(spec,), name=f"dualpath-{role}{e}", daemon=True)
            p.start()
            self._procs.append(p)
            self.processes[e] = p

    def _welcome(self, msg: Join) -> None:
        """Answer a `dualpath engine` that asks to join: a free place of its role (a fenced one's
        under its next incarnation: router/membership.py), or why not."""
        cfg, router = self.cfg, self.router
        engine, incarnation, refused = router.membership.offer_place(EngineRole(msg.role), msg.engine)
        out = Outbox(msg.reply_to, token=router.token)
        out.send(Welcome(engine, config_to_json(cfg), self._store_root, self._fingerprint, router.endpoint,
                         self._layout.full_block_bytes, refused, incarnation))
        out.close()

    async def switch_mode(self, mode: str) -> None:
        """Run the next workload in `mode` on a fresh, empty store, without restarting engines."""
        from dataclasses import replace as _replace

        self.cfg = _replace(self.cfg, mode=mode)
        base = "/dev/shm" if self.cfg.features.io_free and Path("/dev/shm").is_dir() else None
        root = tempfile.mkdtemp(prefix="dp-store-", dir=base)
        self._extra_stores.append(root)
        store = BlockStore(root, self._layout, self._fingerprint, self.cfg.kv_dtype,
                           capacity_bytes=self.cfg.store.capacity_bytes, num_threads=1)
        old = self.store
        await self.router.reconfigure(mode, store, root)
        self.store = store
        if old is not None:
            old.close()

    def _kill(self, engine: int) -> None:
        """Fence an engine for good (router/liveness.py step 4): a frozen one never wakes to write
        into buffers that are others' now."""
        if self.on_fence is not None:
            self.on_fence(engine)
        p = self.processes.get(engine)
        if p is not None and p.pid is not None:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone

    async def _final_reports(self, router: Router, engines: list[int]) -> None:
        """Wait for each stopped engine's last Counters, sent once its writer has drained its persists
        (engine/storage.py `stop`, reporting as it goes): the ledger then holds every byte the
        engines wrote, wherever they run. An engine is given up when nothing comes from it for
        FINAL_REPORT_STALL_S, or for EXITED_REPORT_S once its process here has exited."""
        clock, counters = router.clock, router.metrics.engine_counters
        last = {e: (counters.get(e), clock.now_s()) for e in engines}
        while last:
            await asyncio.sleep(0.05)
            now_s = clock.now_s()
            for e, (seen, since_s) in list(last.items()):
                c, p = counters.get(e), self.processes.get(e)
                stall_s = EXITED_REPORT_S if p is not None and not p.is_alive() else FINAL_REPORT_STALL_S
                if c is not None and c.final:
                    del last[e]
                elif c is not seen:
                    last[e] = (c, now_s)
                elif now_s - since_s > stall_s:
                    del last[e]

    async def stop(self) -> None:
        router = self.router
        if self._watch is not None:
            self._watch.stop()  # planned exits are no faults
            self._watch = None
        stopped: list[int] = []
        if router is not None:
            if router.membership.watch is not None:
                router.membership.watch.cancel()  # engines that stop beating while they close are no faults
            for e in router.membership.live_engines():
                if e.outbox is not None:
                    e.outbox.send(Stop("cluster shutdown"))
                    stopped.append(e.engine)
            await self._final_reports(router, stopped)
        loop = asyncio.get_running_loop()
        for p in self._procs:
            await loop.run_in_executor(None, p.join, 60)
            if p.is_alive():
                p.terminate()
                p.join(5)
        if router is not None:
            router.stop()
        for b in (*self._buffers.values(), *self._landing.values()):
            b.close()
        self._buffers.clear()
        self._landing.clear()
        if self.store is not None:
            self.store.close()
        for d in (self._tmp, self._store_tmp, *self._extra_stores):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        self._procs.clear()
        self.processes.clear()
