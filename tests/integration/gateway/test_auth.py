"""API keys at the gateway (gateway/auth.py): 401 without a valid `Authorization: Bearer` key,
probes and scrapes open, keys never logged, and a per-key request rate with 429 + Retry-After."""
from __future__ import annotations

import logging

import httpx
import pytest

from tests.support.metrics_text import metric_value as sample

GOOD, OTHER, WRONG = "sk-good-0123456789", "sk-other-abcdef", "sk-wrong-zyxwvut"
BODY = {"model": "stub-model", "prompt": "hello", "max_tokens": 2}


@pytest.fixture
def keys_file(tmp_path):
    path = tmp_path / "api-keys"
    path.write_text(f"# keys of the tests\n{GOOD}\n\n  {OTHER}  \n")
    return str(path)


def _bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def test_requests_need_a_valid_key_and_probes_do_not(pd_stack, keys_file):
    gateway, _ = pd_stack(api_keys_file=keys_file)
    url = f"{gateway.url}/v1/completions"
    missing = httpx.post(url, json=BODY)
    wrong = httpx.post(url, json=BODY, headers=_bearer(WRONG))
    for refused in (missing, wrong):
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["code"] == 401
    assert "API key" in missing.json()["error"]["message"]
    assert httpx.post(url, json=BODY, headers=_bearer(GOOD)).status_code == 200
    assert httpx.post(url, json=BODY, headers=_bearer(OTHER)).status_code == 200
    assert httpx.get(f"{gateway.url}/v1/models").status_code == 401
    assert httpx.get(f"{gateway.url}/v1/models", headers=_bearer(GOOD)).status_code == 200
    assert httpx.get(f"{gateway.url}/laps_status").status_code == 401  # it names the pods
    for open_path in ("/health", "/live", "/metrics", "/openapi.json"):
        assert httpx.get(gateway.url + open_path).status_code == 200, open_path
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert sample(metrics, "laps_gateway_auth_failures_total", reason="missing") == 3  # POST, models, status
    assert sample(metrics, "laps_gateway_auth_failures_total", reason="invalid") == 1
    assert GOOD not in metrics and WRONG not in metrics


def test_keys_are_never_logged(pd_stack, keys_file, caplog):
    caplog.set_level(logging.DEBUG)
    gateway, _ = pd_stack(api_keys_file=keys_file)
    assert httpx.post(f"{gateway.url}/v1/completions", json=BODY,
                      headers=_bearer(WRONG)).status_code == 401
    assert httpx.post(f"{gateway.url}/v1/completions", json=BODY,
                      headers=_bearer(GOOD)).status_code == 200
    assert any("invalid API key" in r.getMessage() for r in caplog.records)  # it was logged...
    assert WRONG not in caplog.text and GOOD not in caplog.text              # ...without the key


def test_the_published_schema_names_the_bearer_scheme(pd_stack, keys_file):
    gateway, _ = pd_stack(api_keys_file=keys_file)
    schema = httpx.get(f"{gateway.url}/openapi.json").json()
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert schema["paths"]["/v1/completions"]["post"]["security"] == [{"apiKey": []}]
    assert "security" not in schema["paths"]["/health"]["get"]


def test_a_key_over_its_rate_gets_429_and_others_do_not(pd_stack, keys_file):
    # 0.01/s: the bucket holds one request and refills in 100 s, so the test never races it.
    gateway, _ = pd_stack(api_keys_file=keys_file, rate_limit_per_key=0.01)
    url = f"{gateway.url}/v1/completions"
    assert httpx.post(url, json=BODY, headers=_bearer(GOOD)).status_code == 200
    limited = httpx.post(url, json=BODY, headers=_bearer(GOOD))
    assert limited.status_code == 429 and 1 <= int(limited.headers["retry-after"]) <= 100
    assert "rate limit" in limited.json()["error"]["message"]
    assert httpx.post(url, json=BODY, headers=_bearer(OTHER)).status_code == 200
    assert httpx.post(url, json=BODY, headers=_bearer(WRONG)).status_code == 401
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert sample(metrics, "laps_gateway_rate_limited_total") == 1


def test_without_a_keys_file_there_is_no_authentication(pd_stack):
    gateway, _ = pd_stack()
    assert httpx.post(f"{gateway.url}/v1/completions", json=BODY).status_code == 200


def test_laps_bench_sends_its_api_key_and_says_when_one_is_missing(pd_stack, keys_file, tmp_path):
    import os
    import subprocess
    import sys

    from laps_agent.lab.results import load_result

    gateway, _ = pd_stack(api_keys_file=keys_file)
    workload = tmp_path / "w.yaml"
    workload.write_text("name: auth\nseed: 1\nphases:\n  - name: p\n    requests: 4\n"
                        "    arrival: {process: constant, rate: 50}\n"
                        "    prompt_tokens: {distribution: fixed, value: 8}\n"
                        "    output_tokens: {distribution: fixed, value: 2}\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}

    def bench(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "laps_agent.cli", "bench", "run", gateway.url,
                               "--workload", str(workload), "--tokenizer", "none", "--no-progress",
                               "--out", str(tmp_path / f"r{len(extra)}"), *extra],
                              capture_output=True, text=True, timeout=120, env=env)

    without = bench()
    assert without.returncode == 2 and "wants an API key: give --api-key" in without.stderr
    done = bench("--api-key", GOOD)
    assert done.returncode == 0, done.stderr
    result = load_result(tmp_path / "r2")
    assert all(r.ok for r in result.records) and len(result.records) == 4
    assert GOOD not in done.stdout + done.stderr
