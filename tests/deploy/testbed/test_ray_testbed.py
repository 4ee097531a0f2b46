"""Ray nodes on the testbed (deploy/ray/testbed.py), as root: the plan's management network,
a Ray head in the router host and one Ray worker per node host (its role as a node resource);
`dualpath serve --ray HEAD` in the router host places one engine actor per node host; each runs in
that host's network namespace and listens on its CNIC address; the official `openai` client holds
a multi-turn chat; tear-down leaves no namespace and no process (raylet, worker, engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dualpath.runtime.transport.mooncake import mooncake_loads

from dualpath.deploy.testbed.plan import plan_testbed

MB = 1e6
SERVE_PORT, ROUTER_PORT = 8790, 7100  # inside the router host's namespace: ours alone
CHAT = """
import json, sys, openai
client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1", api_key="unused", timeout=120)
messages, replies = [], []
for text in ("Hello, who are you?", "Tell me more.", "And then?"):
    messages.append({"role": "user", "content": text})
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    replies.append({"content": r.choices[0].message.content, "completion_tokens": r.usage.completion_tokens,
                    "cached_tokens": (r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0)})
    messages.append({"role": "assistant", "content": r.choices[0].message.content})
print(json.dumps(replies))
""" % SERVE_PORT


def test_the_plan_adds_an_unshaped_management_network_only_when_asked():
    from dualpath.deploy.testbed.plan import up_commands

    plain = plan_testbed("m1", 1, 1, 4 * MB, 32 * MB, router=True)
    with_mgmt = plan_testbed("m1", 1, 1, 4 * MB, 32 * MB, router=True, mgmt=True)
    assert plain.mgmt_bridge == "" and plain.mgmt_addr_of == {} and up_commands(plain) == up_commands(
        plan_testbed("m1", 1, 1, 4 * MB, 32 * MB, router=True))
    mgmt = [x for x in with_mgmt.links if x.name == "mgmt"]
    assert [x.host for x in mgmt] == ["dpm1-p0", "dpm1-d0", "dpm1-r"] and not any(x.shaped for x in mgmt)
    assert with_mgmt.mgmt_addr_of == {"dpm1-p0": "10.233.0.1", "dpm1-d0": "10.233.0.2", "dpm1-r": "10.233.0.3"}
    extra = [c for c in up_commands(with_mgmt) if c not in up_commands(plain)]
    assert not any("tc" in c for c in extra)  # no qdisc or class on the management network
    assert ["ip", "-n", "dpm1-fab", "link", "set", "dpm1-p0m", "master", "dpm1-mb"] in extra


def _wait_http(ns: str, port: int, proc: subprocess.Popen, log, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    probe = f"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/health', timeout=5).read().decode())"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited ({proc.returncode}): {log.read_text()[-3000:]}")
        p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe], capture_output=True, text=True)
        if p.returncode == 0 and json.loads(p.stdout).get("status") == "ok":
            return
        time.sleep(1.0)
    raise AssertionError(f"serve not healthy within {timeout_s:.0f} s: {log.read_text()[-3000:]}")


@pytest.mark.testbed_root
@pytest.mark.slow
def test_a_chat_on_ray_nodes_one_per_emulated_host_and_nothing_left(tmp_path, monkeypatch):
    from dualpath.deploy.ray.testbed import RayNodes, pids_in
    from dualpath.deploy.testbed import netns

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    run_id = f"y{os.getpid() % 9999}"
    plan = plan_testbed(run_id, 1, 1, 8 * MB, 32 * MB, run_index=249, router=True, mgmt=True)
    token = tmp_path / "token"
    token.write_text("the testbed's secret\n")
    netns.up(plan)
    nodes = RayNodes(plan, {}, tmp_path)
    serve = None
    try:
        nodes.start()
        nodes.wait_joined()
        log = tmp_path / "serve.log"
        router_ip = plan.cnic_addr_of[plan.router_ns]
        with open(log, "w") as f:
            serve = subprocess.Popen(["ip", "netns", "exec", plan.router_ns, sys.executable, "-m", "dualpath.cli", "serve",
                                      "--model", "tiny", "--ray", nodes.head_address, "--engines-listen",
                                      f"tcp://{router_ip}:{ROUTER_PORT}", "--token-file", str(token), "--host", "127.0.0.1",
                                      "--port", str(SERVE_PORT)], stdout=f, stderr=subprocess.STDOUT, env=nodes.env,
                                     start_new_session=True)
        _wait_http(plan.router_ns, SERVE_PORT, serve, log, 240)
        chat = subprocess.run(["ip", "netns", "exec", plan.router_ns, sys.executable, "-c", CHAT], capture_output=True,
                              text=True, timeout=300)
        assert chat.returncode == 0, chat.stderr[-3000:]
        replies = json.loads(chat.stdout)
        assert [r["completion_tokens"] for r in replies] == [8, 8, 8]
        assert replies[2]["cached_tokens"] > 0  # the third turn hit the KV the decode host persisted
        # each engine ran in its own host's namespace: its Ray worker's processes are there
        for host in plan.hosts:
            inside = " ".join(open(f"/proc/{p}/cmdline").read() for p in pids_in(host) if os.path.exists(f"/proc/{p}"))
            assert "raylet" in inside and "EngineActor" in inside.replace("\0", " "), host
    finally:
        if serve is not None and serve.poll() is None:
            os.killpg(serve.pid, 15)
            try:
                serve.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, 9)
        nodes.stop()
        leftover = {ns: pids_in(ns) for ns in plan.namespaces}
        netns.down(plan.run_id)
    assert leftover == {ns: [] for ns in plan.namespaces}
    assert not netns.namespaces_with_prefix(f"dp{run_id}-")
    assert not os.path.exists(nodes.temp_dir)


@pytest.mark.testbed_root
@pytest.mark.slow
@pytest.mark.parametrize("transfer", ["remote-write", "mooncake"])
def test_the_demo_on_ray_nodes_gives_one_hosts_tokens_and_survives_a_killed_decode_actor(tmp_path, monkeypatch,
                                                                                         transfer):
    """`demo --testbed --ray`, small (tiny model, dualpath mode): the engines are Ray actors, each in
    its host's namespace; the tokens equal one host's; the restart check's kill -9 of the decode
    actor's process is followed by a restart whose request and the next one get the baseline's
    tokens; nothing is left. With either transfer (Mooncake's engine starts in each actor)."""
    if transfer == "mooncake" and not mooncake_loads():
        pytest.skip("Mooncake Transfer Engine does not load here")
    from dualpath.deploy.testbed.demo import check_result, run_testbed_demo
    from dualpath.deploy.testbed import netns

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    run_id = f"z{os.getpid() % 9999}"
    result = run_testbed_demo(model="tiny", agents=2, rounds=4, snic_bytes_per_s=2 * MB, run_id=run_id,
                              log=lambda line: None, modes=("dualpath",), ray=True, transfer=transfer)
    assert not netns.namespaces_with_prefix(f"dp{run_id}-")
    (dual,) = result["runs"]
    assert dual["tokens_sha256"] == result["reference_tokens_sha256"]
    assert dual["bytes"]["remote_writes"] > 0 and dual["bytes"]["storage_via_decode"] > 0
    hosts = result["config"]["testbed"]["hosts"]
    # engine e ran inside host e's namespace (its /proc/self/ns/net), on that host's Ray node
    assert [e["netns"] for e in dual["ray_engines"]] == [result["ray"]["host_netns"][h] for h in hosts]
    assert len(set(result["ray"]["host_netns"].values())) == 2
    assert [e["node_ip"] for e in dual["ray_engines"]] == [result["config"]["testbed"]["mgmt_addr_of"][h] for h in hosts]
    restart = result["ray"]["restart"]
    assert restart["before"]["pid"] != restart["after"]["pid"] and restart["before"]["netns"] == restart["after"]["netns"]
    assert restart["in_flight_same"] and restart["next_same"] and restart["restarts"] == {"1": 1}
    assert restart["in_flight_s"] < 60.0  # deploy/ray/engines.py: ENGINE_RESTART_WAIT_S: the bound
    assert check_result(result) == []
