"""Fuzz the OpenAI-compatible HTTP API from its own OpenAPI schema (schemathesis).

    PYTHONPATH=src python tools/fuzz_api.py [--requests 10000] [--seed 0] [--url URL] [--json FILE]

Without --url it starts the server over a `FakeBackend` on a free loopback port. The budget is
spread over every operation of /openapi.json x {positive, negative} generation (negative: bodies,
paths and queries that break the schema); an operation whose input space runs out early (GET
/health has none) hands its share to the rest. Reported: requests sent, responses by operation,
mode and status, the first failures (a 5xx, or no response at all), and whether the server still
answers a valid request afterwards. Exit status 1 on any failure.

`tests/runtime/server/test_server_fuzz.py` runs a small budget of this in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

REQUEST_TIMEOUT_S = 30.0  # a response slower than this counts as no response (the fake backend answers in ms)
MAX_FAILURES_KEPT = 20
VALID_REQUEST = {"messages": [{"role": "user", "content": "still there?"}], "max_tokens": 8}


@dataclass
class FuzzReport:
    num_requests: int = 0
    wall_s: float = 0.0
    # "METHOD /path mode status" -> responses ("... none" when no response came)
    responses: Counter[str] = field(default_factory=Counter)
    failures: list[dict] = field(default_factory=list)  # the first MAX_FAILURES_KEPT
    num_failures: int = 0
    # negative (schema-breaking) cases the server served with a 2xx: not failures, but each is input
    # the schema forbids and the server accepts; the first MAX_FAILURES_KEPT, to look at
    accepted_negative: list[dict] = field(default_factory=list)
    alive_after: bool = False

    def count_status(self, low: int, high: int) -> int:
        """Responses with a status in [low, high)."""
        return sum(n for key, n in self.responses.items() if key.split()[-1].isdigit() and low <= int(key.split()[-1]) < high)


def _fuzz_one(report: FuzzReport, operation, mode: GenerationMode, base_url: str, session: requests.Session,
              budget: int, seed_value: int) -> None:
    stop_at = report.num_requests + budget  # hypothesis may run a few more examples than asked (shrinking is off)

    @seed(seed_value)
    @settings(max_examples=budget, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case) -> None:
        if report.num_requests >= stop_at:
            return
        key = f"{operation.label} {mode.value}"
        report.num_requests += 1
        try:
            status: int | None = case.call(base_url=base_url, session=session, timeout=REQUEST_TIMEOUT_S).status_code
            text = ""
        except requests.RequestException as exc:
            status, text = None, f"{type(exc).__name__}: {exc}"
        report.responses[f"{key} {status if status is not None else 'none'}"] += 1
        if mode is GenerationMode.NEGATIVE and status is not None and status < 300 and (
                len(report.accepted_negative) < MAX_FAILURES_KEPT):
            report.accepted_negative.append({"operation": key, "status": status, "curl": case.as_curl_command()})
        if status is None or status >= 500:
            report.num_failures += 1
            if len(report.failures) < MAX_FAILURES_KEPT:
                report.failures.append({"operation": key, "status": status, "error": text,
                                        "curl": case.as_curl_command()})

    try:
        run()
    except Unsatisfiable:  # e.g. no negative input exists for an operation without parameters
        pass


def fuzz(base_url: str, num_requests: int, seed_value: int = 0) -> FuzzReport:
    """About `num_requests` generated requests against the server at `base_url` (see the module docstring)."""
    report = FuzzReport()
    start_s = time.monotonic()
    schema = schemathesis.openapi.from_url(base_url.rstrip("/") + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    pairs = [(op, mode) for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    with requests.Session() as session:
        for i, (operation, mode) in enumerate(pairs):
            share = max(1, (num_requests - report.num_requests) // (len(pairs) - i))
            _fuzz_one(report, operation, mode, base_url, session, share, seed_value + i)
        try:
            reply = session.post(base_url.rstrip("/") + "/v1/chat/completions", json=VALID_REQUEST, timeout=REQUEST_TIMEOUT_S)
            report.alive_after = reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
        except (requests.RequestException, ValueError, KeyError):
            report.alive_after = False
    report.wall_s = time.monotonic() - start_s
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="generated requests in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", help="fuzz this running server instead of a FakeBackend one")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    server = None
    if args.url is None:
        sys.path.insert(0, "tests/runtime/server")
        from conftest import RunningServer  # the tests' uvicorn-in-a-thread server

        from dualpath.runtime.server.fake_backend import FakeBackend

        server = RunningServer(FakeBackend(), None)
    try:
        report = fuzz(args.url or server.url, args.requests, args.seed)
    finally:
        if server is not None:
            server.stop()
    for key, n in sorted(report.responses.items()):
        print(f"{n:7d}  {key}")
    print(f"{report.num_requests} requests in {report.wall_s:.1f} s: {report.count_status(200, 300)} 2xx, "
          f"{report.count_status(400, 500)} 4xx, {report.num_failures} failures (5xx or no response); "
          f"a valid request after: {'200' if report.alive_after else 'FAILED'}")
    for failure in report.failures:
        print(json.dumps(failure))
    for accepted in report.accepted_negative:
        print("accepted although schema-breaking:", json.dumps(accepted))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**asdict(report), "responses": dict(report.responses)}, f, indent=1)
    return 0 if report.num_failures == 0 and report.alive_after else 1


if __name__ == "__main__":
    sys.exit(main())
