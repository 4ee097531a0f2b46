"""/v1/models, /health, /metrics and the API key."""

from __future__ import annotations

import httpx
import pytest

from dualpath.runtime.server.fake_backend import FakeBackend

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_models_health_metrics(start_server):
    server = start_server(FakeBackend(model_name="smol", max_context_tokens=1024))
    with httpx.Client(base_url=server.url) as client:
        models = client.get("/v1/models").json()
        assert models["object"] == "list"
        assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [("smol", "model", 1024)]
        assert client.get("/v1/models/other").status_code == 404

        health = client.get("/health")
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "model": "smol", "num_active_requests": 0}

        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert client.post("/v1/chat/completions", json={**CHAT, "top_p": 2}).status_code == 400
        metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = metrics.text.splitlines()
    assert "# TYPE dualpath_router_requests_total counter" in lines
    assert "dualpath_router_requests_total 1.0" in lines and "dualpath_router_generated_tokens_total 2.0" in lines
    assert 'dualpath_http_responses_total{code="200",route="/v1/chat/completions"} 1.0' in lines
    assert 'dualpath_http_responses_total{code="400",route="/v1/chat/completions"} 1.0' in lines
    assert metrics.text.endswith("\n")


def test_unhealthy_router_is_503(start_server):
    class Sick(FakeBackend):
        def health(self) -> dict:
            return {"status": "unavailable", "reason": "decode engine 1 is gone"}

    response = httpx.get(start_server(Sick()).url + "/health")
    assert response.status_code == 503 and response.json()["reason"] == "decode engine 1 is gone"


def test_a_degraded_router_still_serves_and_says_so(start_server):
    """An engine is down but every role has a live one (runtime/router/liveness.py): not "ok", yet 200,
    so a load balancer keeps sending what the router can serve."""
    class Degraded(FakeBackend):
        def health(self) -> dict:
            return {"status": "degraded", "down": [{"engine": 1, "role": "decode", "cause": "killed by SIGKILL"}]}

    response = httpx.get(start_server(Degraded()).url + "/health")
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    assert response.json()["down"][0]["cause"] == "killed by SIGKILL"


def test_api_key(start_server):
    server = start_server(api_key="s3cret")
    with httpx.Client(base_url=server.url) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions")):
                response = client.request(method, path, json=CHAT, headers=headers)
                assert response.status_code == 401
                assert response.json()["error"]["type"] == "authentication_error"
        bad_json_no_key = client.post("/v1/chat/completions", content=b"{",
                                      headers={"Content-Type": "application/json"})
        assert bad_json_no_key.status_code == 401  # the key is checked before the body
        good = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer s3cret"})
        assert good.status_code == 200
        assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    assert len(server.router.received) == 1


def test_prometheus_exposition_escapes_and_formats():
    from dualpath.metrics.prometheus import Sample, family, render, summary_samples

    text = render(family("x_total", "counter", "help with \\ and\nnewline",
                         [Sample(3, {"path": 'a"b\\c\nd', "code": "200"}), Sample(0.5), Sample(float("inf"))]),
                  family("lat_s", "summary", "latency", summary_samples({"0.5": 0.25}, 4)))
    assert text.splitlines() == [
        "# HELP x_total help with \\\\ and\\nnewline",
        "# TYPE x_total counter",
        'x_total{code="200",path="a\\"b\\\\c\\nd"} 3.0',
        "x_total 0.5",
        "x_total +Inf",
        "# HELP lat_s latency",
        "# TYPE lat_s summary",
        'lat_s{quantile="0.5"} 0.25',
        "lat_s_count 4.0",
    ]
    with pytest.raises(ValueError, match="must end in _total"):
        family("x", "counter", "a counter without _total", [])


def test_lifespan_runs_on_the_server_loop(start_server):
    import asyncio
    import contextlib

    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        events.append(f"start on a running loop: {asyncio.get_running_loop().is_running()}")
        yield
        events.append("stop")

    server = start_server(lifespan=lifespan)
    assert events == ["start on a running loop: True"]
    assert httpx.get(server.url + "/health").status_code == 200
    server.stop()
    assert events[-1] == "stop"


def test_keys_mapped_to_tenants_salt_each_tenants_cache(start_server):
    """--api-keys: each key's tenant salts its requests' cache keys (app.py: cache_salt), whatever
    cache_salt the request sends; a request's own salt separates it further within its tenant."""
    from dualpath.runtime.server.app import cache_salt

    server = start_server(api_key={"key-a": "alpha", "key-b": "beta"})
    with httpx.Client(base_url=server.url) as client:
        assert client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer key-c"}).status_code == 401
        for key, body in (("key-a", CHAT), ("key-b", CHAT), ("key-a", {**CHAT, "cache_salt": "s"}),
                          ("key-b", {**CHAT, "cache_salt": "s"})):
            assert client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}).status_code == 200
        bad = client.post("/v1/chat/completions", json={**CHAT, "cache_salt": ""}, headers={"Authorization": "Bearer key-a"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"
    salts = [r.cache_salt for r in server.router.received]
    assert salts == [cache_salt("alpha", None), cache_salt("beta", None), cache_salt("alpha", "s"), cache_salt("beta", "s")]
    assert len(set(salts)) == 4 and all(salts)  # no two tenants share a salt, even when both send "s"


def test_without_tenants_the_requests_cache_salt_is_its_own(start_server):
    server = start_server()
    with httpx.Client(base_url=server.url) as client:
        assert client.post("/v1/chat/completions", json={**CHAT, "cache_salt": "team-1"}).status_code == 200
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "cache_salt": "team-2"}).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert [r.cache_salt for r in server.router.received] == ["team-1", "team-2", ""]
