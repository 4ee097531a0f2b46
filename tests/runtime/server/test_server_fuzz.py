"""HTTP fuzzing from the server's own OpenAPI schema (schemathesis, tools/fuzz_api.py): a small
budget of generated requests, valid and schema-breaking, gets no 5xx, and the server answers a
valid request afterwards. `python tools/fuzz_api.py --requests 10000` runs the large budget."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import httpx
import pytest

from dualpath.runtime.server.fake_backend import DEFAULT_REPLY_TEXT

pytest.importorskip("schemathesis")
TOOL = Path(__file__).resolve().parents[3] / "tools" / "fuzz_api.py"
NUM_REQUESTS = 300  # ~4 s on 2 CPU cores


def load_tool():
    spec = importlib.util.spec_from_file_location("fuzz_api", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_fuzzed_requests_get_no_server_error(start_server):
    server = start_server()
    report = load_tool().fuzz(server.url, NUM_REQUESTS, seed_value=0)
    assert report.num_failures == 0, report.failures
    assert NUM_REQUESTS * 0.9 <= report.num_requests <= NUM_REQUESTS
    # both kinds of input really reached the server: served requests and refused ones
    assert report.responses["POST /v1/chat/completions positive 200"] > 0
    assert report.responses["POST /v1/completions negative 400"] > 0
    assert report.responses["POST /v1/chat/completions negative 400"] > 0
    assert report.count_status(500, 600) == 0 and report.alive_after
    reply = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY_TEXT
    assert server.admission.num_inflight == 0
    server.admission.check_invariants()
