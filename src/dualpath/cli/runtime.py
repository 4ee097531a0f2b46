"""`dualpath generate | serve | run`: the real runtime on this host (the demo is in demo.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError
from ..progress import reporter
from .io import console, out
from .results import RUNTIME_COLUMNS, print_runs


def plot_runtime(result: dict, path: Path, title: str) -> None:
    from ..metrics.plots import plot_runs

    plot_runs(result, path, title, bytes_scale=1e6, bytes_unit="MB")


DeviceOption = Annotated[str, typer.Option(
    help="cpu, cuda (engine e on GPU e mod #GPUs) or cuda:N; checked before anything starts")]


SetOption = Annotated[Optional[list[str]], typer.Option(
    "--set", help="override a RuntimeConfig field: section.field=value (e.g. faults.retries=0, "
    "store.timeout_s=2, engines.max_decode_batch=32); repeat")]


TpOption = Annotated[int, typer.Option(
    "--tp", help="tensor-parallel ranks per engine: 1, or 2 (each layer's MLP split over two processes; "
    "a broadcast and an all_reduce per layer, on the latency-critical lane; cpu only)")]


TransferOption = Annotated[str, typer.Option(
    help="who moves KV between engines: remote-write (ours; shared memory on one host) | mooncake (Mooncake "
         "Transfer Engine, as across hosts on loopback too: engines talk over tcp; needs dualpath[mooncake])")]


def transfer_overrides(transfer: str) -> list[str]:
    """`--transfer` as `--set` overrides: mooncake moves KV as across hosts (transport.kind tcp)."""
    from ..config import KvTransfer
    from ..config.runtime import choice

    if choice(KvTransfer, transfer, "--transfer") is KvTransfer.MOONCAKE:
        from ..runtime.transport.mooncake import require_mooncake

        require_mooncake()  # a missing package: one line before any engine or namespace exists
        return ["transport.kind=tcp", f"transport.transfer={transfer}"]
    return []


def tp_config(ranks: int, **placement):
    """RuntimeConfig.tp from `--tp` (validated there: 1 or 2)."""
    from ..config.tp import TensorParallelConfig

    return TensorParallelConfig(ranks, **placement)


def _device(spec: str) -> str:
    from ..runtime.engine.device import require_device

    require_device(spec)
    return spec


def generate(
    model: Annotated[str, typer.Option(help="smollm2-135m, tiny, a .gguf file or a safetensors folder")] = "smollm2-135m",
    prompt: Annotated[Optional[str], typer.Option(help="text (through the chat template when the model has one)")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option(help="comma-separated token ids")] = None,
    max_tokens: Annotated[int, typer.Option()] = 64,
    temperature: Annotated[float, typer.Option()] = 0.0,
    top_p: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[Optional[int], typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print prompt_ids, generated_ids and text as JSON")] = False,
    chat: Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="--prompt through the chat template, or raw (default: the template when the model has one)")] = None,
    device: DeviceOption = "cpu",
) -> None:
    """One-shot generation (prefill + paged decode) for scripts and checks."""
    from ..runtime.model import generate_text

    if (prompt is None) == (prompt_ids is None):
        raise InputError("give exactly one of --prompt and --prompt-ids")
    if max_tokens <= 0:
        raise InputError("--max-tokens must be positive")
    ids = None
    if prompt_ids is not None:
        try:
            ids = [int(x) for x in prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--prompt-ids: expected comma-separated integers, got {prompt_ids!r}") from None
        if not ids:
            raise InputError("--prompt-ids is empty")
    res = generate_text(model, prompt=prompt, prompt_ids=ids, max_tokens=max_tokens, temperature=temperature,
                        top_p=top_p, seed=seed, chat=chat, device=_device(device))
    if res.text is None:  # a folder without tokenizer: ids only (stderr keeps stdout parseable)
        typer.echo(f"no tokenizer in {model}: text not decoded", err=True)
    if as_json:
        out.print_json(json.dumps({"prompt_ids": list(res.prompt_ids), "generated_ids": list(res.generated_ids), "text": res.text}))
    elif res.text is None:
        out.print(",".join(map(str, res.generated_ids)))
    else:
        out.print(res.text)

def serve(
    model: Annotated[str, typer.Option()] = "smollm2-135m",
    pd: Annotated[str, typer.Option(help="engines, e.g. 1P1D")] = "1P1D",
    mode: Annotated[str, typer.Option(help="basic | dualpath | oracle | dualpath+split | selective (beyond the paper) | basic+layerwise[+de_read][+scheduler]; any +tail, +selective, +dram")] = "dualpath",
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    api_key: Annotated[Optional[str], typer.Option(help="require this Bearer key on /v1")] = None,
    api_keys: Annotated[Optional[Path], typer.Option(help="a JSON object of Bearer keys to tenants: each key's requests are cached apart (cache_salt)")] = None,
    store_dir: Annotated[Optional[str], typer.Option("--store-dir", "--store", help="KV store: a directory or tcp://HOST:PORT of `dualpath store serve` (default: a temporary directory)")] = None,
    snic_mb_s: Annotated[Optional[float], typer.Option(help="emulated SNIC cap per node, MB/s (default: none)")] = None,
    device: DeviceOption = "cpu",
    max_inflight_requests: Annotated[Optional[int], typer.Option(
        help="requests admitted at once; more get 429 + Retry-After (default 256)")] = None,
    max_queued_prompt_tokens: Annotated[Optional[int], typer.Option(
        help="prompt tokens admitted and not yet prefilled; more get 429 (default 262144)")] = None,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help="longest prompt; longer is a 400 (default 65536)")] = None,
    max_body_bytes: Annotated[Optional[int], typer.Option(help="largest request body; larger is a 413 (default 8 MiB)")] = None,
    engine_fault_policy: Annotated[str, typer.Option(help="a request whose engine dies: recompute (migrate) | fail (503)")] = "recompute",
    heartbeat_timeout_s: Annotated[Optional[float], typer.Option(help="fence an engine silent this long (default 5 s)")] = None,
    engines_listen: Annotated[Optional[str], typer.Option(help="tcp://HOST:PORT: start no engines; wait for `dualpath engine`s to join here")] = None,
    token_file: Annotated[Optional[Path], typer.Option(help="shared token of the router and engines (required beyond loopback)")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", help="engines as Ray actors: local | auto | HOST:PORT (needs dualpath[cluster])")] = None,
    transfer: TransferOption = "remote-write",
    tp: TpOption = 1,
    set_: SetOption = None,
) -> None:
    """OpenAI-compatible server on a PD-disaggregated cluster: engines started here, or joining from other hosts."""
    from ..config import FaultConfig, LinkConfig, RuntimeConfig, StoreConfig, TransportConfig, parse_pd
    from ..config.overrides import apply_overrides
    from ..runtime.apps.serve import serve_cluster
    from ..runtime.server.admission import ServerLimits

    given = dict(max_inflight_requests=max_inflight_requests, max_queued_prompt_tokens=max_queued_prompt_tokens,
                 max_prompt_tokens=max_prompt_tokens, max_body_bytes=max_body_bytes)
    limits = ServerLimits(**{name: value for name, value in given.items() if value is not None})

    p, d = parse_pd(pd)
    if ray is not None and engines_listen is None:  # port 0: the router binds a free one, then the actors start
        engines_listen = f"tcp://{'127.0.0.1' if ray == 'local' else host}:0"
    faults = FaultConfig(policy=engine_fault_policy)
    if heartbeat_timeout_s is not None:
        faults = FaultConfig(policy=engine_fault_policy, heartbeat_timeout_s=heartbeat_timeout_s)
    remote = engines_listen or ray or transfer == "mooncake"  # Mooncake moves KV as across hosts, on loopback too
    transport = TransportConfig(kind="tcp" if remote else "local", transfer=transfer,
                                peer_token_file=None if token_file is None else str(token_file))
    cfg = RuntimeConfig(model=model, num_prefill=p, num_decode=d, mode=mode, device=device, tp=tp_config(tp),
                        links=LinkConfig(snic_bytes_per_s=None if snic_mb_s is None else snic_mb_s * 1e6),
                        store=StoreConfig(location=store_dir or None), faults=faults, transport=transport)
    cfg = apply_overrides(cfg, set_ or [])
    _device(device)
    server = dict(host=host, port=port, api_key=_api_keys(api_key, api_keys), limits=limits, engines_listen=engines_listen)
    if ray is None:
        serve_cluster(cfg, **server)
    else:
        from ..deploy.ray.commands import serve_on_ray

        serve_on_ray(ray, cfg, **server)



def _api_keys(key: str | None, keys_file: Path | None) -> str | dict[str, str] | None:
    """--api-key, or --api-keys' map of keys to tenants (checked: one line and exit 2 if wrong)."""
    if keys_file is None:
        return key
    if key is not None:
        raise InputError("give one of --api-key and --api-keys")
    try:
        keys = json.loads(keys_file.read_text())
    except OSError as exc:
        raise InputError(f"--api-keys: cannot read {keys_file} ({exc.strerror})") from None
    except ValueError as exc:
        raise InputError(f"--api-keys: {keys_file} is not JSON ({exc})") from None
    if not isinstance(keys, dict) or not keys or not all(isinstance(k, str) and k and isinstance(t, str) and t
                                                         for k, t in keys.items()):
        raise InputError(f"--api-keys: {keys_file} must be a JSON object of non-empty keys to non-empty tenant names")
    return keys


def engine(
    router: Annotated[str, typer.Option(help="the router's --engines-listen address, tcp://HOST:PORT")],
    role: Annotated[str, typer.Option(help="prefill | decode")],
    token_file: Annotated[Optional[Path], typer.Option(help="the cluster's shared token (required beyond loopback)")] = None,
    listen: Annotated[str, typer.Option(help="this host's address peers reach it at (control and KV)")] = "127.0.0.1",
    device: Annotated[Optional[str], typer.Option(help="cpu | cuda | cuda:N (default: the router's)")] = None,
    threads: Annotated[Optional[int], typer.Option(help="torch threads (default: the router's, else this host's CPUs)")] = None,
    join_timeout_s: Annotated[float, typer.Option(help="how long to wait for the router's answer")] = 120.0,
    store: Annotated[Optional[str], typer.Option(help="this host's URL of the storage service (default: the router's)")] = None,
    tp: TpOption = 1,
    tp_peer_host: Annotated[Optional[str], typer.Option(help="--tp 2: rank 1's address (default: --listen)")] = None,
    tp_peer_netns: Annotated[Optional[str], typer.Option(help="--tp 2: start rank 1 in this network namespace (root)")] = None,
) -> None:
    """One engine on this host, joining a router started with `dualpath serve --engines-listen`."""
    from ..runtime.engine.join import join, run_joined

    tp_cfg = tp_config(tp, leader_host=listen, follower_host=tp_peer_host or listen, follower_netns=tp_peer_netns)
    welcome = join(router, role, None if token_file is None else str(token_file), listen, join_timeout_s)
    print(f"joined {router} as engine {welcome.engine} ({role})", flush=True)
    run_joined(welcome, listen, device, threads, store, tp_cfg)


def run(
    trace: Annotated[Path, typer.Argument(help="trajectory JSONL, an agentic Mooncake trace (session_id: agents with tool time) or a Mooncake trace")],
    model: Annotated[str, typer.Option()] = "smollm2-135m",
    pd: Annotated[str, typer.Option()] = "1P1D",
    mode: Annotated[list[str], typer.Option(help="basic | dualpath | oracle | dualpath+split | selective (beyond the paper) | basic+W[+W]; any +tail, +selective, +dram; repeat for several runs")] = ["dualpath"],
    limit: Annotated[int, typer.Option(help="first N agents / requests")] = 8,
    max_len: Annotated[int, typer.Option(help="truncate prompts (tokens)")] = 4096,
    time_scale: Annotated[float, typer.Option(help="Mooncake: multiply timestamps")] = 1.0,
    snic_mb_s: Annotated[Optional[float], typer.Option()] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    decisions: Annotated[Optional[Path], typer.Option(help="write every scheduling decision as JSONL, one file per mode: F -> F.<mode>.jsonl (the simulator's schema)")] = None,
    timeline: Annotated[Optional[Path], typer.Option(help="write each mode's spans as a Chrome trace (Perfetto), one file per mode: F.json -> F.<mode>.json (the simulator's names)")] = None,
    device: DeviceOption = "cpu",
    testbed: Annotated[bool, typer.Option("--testbed", help="across emulated hosts, the kernel capping every link "
                                          "(root; needs --snic-mb-s; CNIC 8x)")] = False,
    ray: Annotated[Optional[str], typer.Option("--ray", help="engines as Ray actors: local | auto | HOST:PORT "
                                               "(needs dualpath[cluster])")] = None,
    transfer: TransferOption = "remote-write",
    set_: SetOption = None,
) -> None:
    """Replay a trajectory file, an agentic trace or a Mooncake trace against the local cluster (agents wait their tool time between rounds)."""
    from ..runtime.apps.run import local_cluster, run_trace
    from ..sim.runner import write_json

    _device(device)
    if not trace.is_file():
        raise InputError(f"file not found: {trace}")
    if limit <= 0 or max_len <= 0 or time_scale < 0:
        raise InputError("--limit and --max-len must be positive, --time-scale >= 0")
    if testbed and ray is not None:
        raise InputError("run --testbed --ray is not wired: use demo --testbed --ray, or run --ray on your own cluster")
    overrides = transfer_overrides(transfer) + list(set_ or [])
    if testbed:
        from .testbed import testbed_run

        if snic_mb_s is None or snic_mb_s <= 0:
            raise InputError("--testbed needs --snic-mb-s > 0: the kernel caps each node's SNIC link at it")
        if decisions is not None or timeline is not None:
            raise InputError("--decisions and --timeline are not written on the testbed (the router runs in its own namespace)")
        return testbed_run(trace, model, pd, mode, limit, max_len, time_scale, snic_mb_s, device, json_path, transfer)
    with contextlib.ExitStack() as stack:
        clusters, placement = local_cluster, {}
        if ray is not None:
            from ..deploy.ray.commands import ray_clusters

            clusters, placement = stack.enter_context(ray_clusters(ray)), {"ray": ray}
        with reporter("run", "turns", console, snic_bytes_per_s=None if snic_mb_s is None else snic_mb_s * 1e6) as progress:
            progress.log(f"replaying {trace.name} on a local {pd} cluster ({model} on {device}); modes {', '.join(mode)}")
            result = asyncio.run(run_trace(trace, model, pd, mode, limit, max_len, time_scale, snic_mb_s, device,
                                           on_turn=progress.update, decisions=decisions, timeline=timeline,
                                           clusters=clusters, placement=placement, overrides=overrides))
    print_runs(result, f"replay of {trace.name}", 1e6, "MB", RUNTIME_COLUMNS)
    for r in result["runs"]:
        for key in ("decisions_file", "timeline_file"):
            if key in r:
                console.print(f"wrote {r[key]}")
    if json_path:
        write_json(result, json_path)
