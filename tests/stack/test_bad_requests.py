"""Every class of bad request gets its 4xx and an OpenAI error object, never a 500 or a hang."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

LONG_PROMPT = list(range(10, 4200))  # more token ids than the 4096-token context

# (name, path, raw body, expected status, expected param)
BAD_REQUESTS: list[tuple[str, str, bytes, int, str | None]] = [
    ("malformed_json", "/v1/completions", b'{"model": "tiny", "prompt": ', 400, None),
    ("not_an_object", "/v1/completions", b'["tiny"]', 400, None),
    ("invalid_utf8", "/v1/completions", b'{"model": "tiny", "prompt": "\xff"}', 400, None),
    ("missing_model", "/v1/completions", b'{"prompt": "hi"}', 400, "model"),
    ("missing_prompt", "/v1/completions", b'{"model": "tiny"}', 400, "prompt"),
    ("missing_messages", "/v1/chat/completions", b'{"model": "tiny"}', 400, "messages"),
    ("wrong_type_prompt", "/v1/completions", b'{"model": "tiny", "prompt": 42}', 400, "prompt"),
    ("wrong_type_stream", "/v1/completions", b'{"model": "tiny", "prompt": "x", "stream": "yes"}', 400, "stream"),
    ("wrong_type_messages", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": 1}]}', 400, "messages[0].content"),
    ("unknown_model", "/v1/completions", b'{"model": "gpt-9", "prompt": "x"}', 404, "model"),
    ("unknown_model_chat", "/v1/chat/completions",
     b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ("prompt_too_long", "/v1/completions", json.dumps({"model": "tiny", "prompt": LONG_PROMPT}).encode(), 400,
     "prompt"),
    ("max_tokens_zero", "/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    ("max_tokens_past_context", "/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 5000}', 400,
     "max_tokens"),
    ("max_tokens_negative_chat", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
    ("token_id_out_of_vocab", "/v1/completions", b'{"model": "tiny", "prompt": [99999999]}', 400, "prompt"),
    ("empty_prompt", "/v1/completions", b'{"model": "tiny", "prompt": ""}', 400, "prompt"),
    ("n_greater_than_one", "/v1/completions", b'{"model": "tiny", "prompt": "x", "n": 2}', 400, "n"),
    ("oversized_body", "/v1/completions", b'{"model": "tiny", "prompt": "' + b"a" * (1 << 20) + b'"}', 413, None),
    # issue 11, finding 7: each of these was a 500
    ("lone_surrogate_prompt", "/v1/completions", b'{"model": "tiny", "prompt": "ab\\ud800cd"}', 400, "prompt"),
    ("lone_surrogate_message", "/v1/chat/completions",
     b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}]}', 400, "messages[0].content"),
    ("lone_surrogate_model", "/v1/completions", b'{"model": "\\ud83d", "prompt": "x"}', 400, "model"),
    ("nested_100k_deep", "/v1/completions",
     b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, None),
    ("nested_70_deep", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "x": ' + b"[" * 70 + b"]" * 70 + b"}", 400, None),
    ("int_5000_digits", "/v1/completions",
     b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"7" * 5000 + b"}", 400, None),
    ("int_40_digits", "/v1/completions", b'{"model": "tiny", "prompt": "x", "seed": ' + b"7" * 40 + b"}", 400, None),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), [c[1:] for c in BAD_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS])
def test_bad_request_gets_4xx_error_object(stack: StackProcess, admin: Any, path: str, body: bytes, status: int,
                                           param: str | None) -> None:
    r = httpx.post(stack.url + path, content=body, headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param


def test_oversized_body_refused_while_reading(stack: StackProcess, admin: Any) -> None:
    """A chunked upload without Content-Length is cut off at the cap, not buffered whole."""

    def chunks() -> Any:
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(64):
            yield b"a" * 65536  # 4 MiB in all, four times the cap
        yield b'"}'

    r = httpx.post(stack.url + "/v1/completions", content=chunks(), timeout=10)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_unknown_route_and_method_are_json(stack: StackProcess) -> None:
    r = httpx.get(stack.url + "/v1/nothing", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = httpx.get(stack.url + "/v1/completions", timeout=5)
    assert r.status_code == 405 and "error" in r.json()


def test_no_bad_request_class_produces_500(stack: StackProcess, admin: Any) -> None:
    """A sweep of odd values for every field: the answer is always a 4xx with an error object or a 200."""
    odd_values: list[Any] = [None, True, -1, 0, 1.5, "x", [], {}, [1, "a"], 10**30]
    fields = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stream", "stream_options", "n", "stop",
              "logprobs", "ignore_eos", "stop_token_ids", "echo"]
    bodies = [(field, value) for field in fields for value in odd_values]

    def post(case: tuple[str, Any]) -> tuple[str, Any, httpx.Response]:
        field, value = case
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1, field: value}
        return field, value, client.post(stack.url + "/v1/completions", json=body)

    # in parallel: each small POST otherwise pays a delayed-ACK round trip from httpx's split writes; one
    # client, not one per POST (each would build its own TLS context: 37 ms of CPU, 5 s over the sweep)
    with httpx.Client(timeout=10, limits=httpx.Limits(max_connections=8)) as client, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, bodies))
    statuses = set()
    for field, value, r in answers:
        statuses.add(r.status_code)
        assert r.status_code < 500, (field, value, r.text)
        if r.status_code >= 400:
            assert "error" in r.json(), (field, value, r.text)
    assert 400 in statuses and 200 in statuses


ADMIN_BAD_BODIES: list[tuple[str, str, str, bytes]] = [
    # 30,000 deep: under the 64 KiB admin cap, far over json.loads' recursion limit (a 500 before)
    ("deep_json_fault", "PUT", "/faults/x", b"[" * 30_000 + b"]" * 30_000),
    ("deep_json_reserve", "POST", "/kv/reserve", b'{"blocks": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"),
    ("long_int_reserve", "POST", "/kv/reserve", b'{"blocks": ' + b"9" * 5000 + b"}"),
    ("lone_surrogate_fault", "PUT", "/faults/x", b'{"type": "timeout", "where": "\\ud800", "fraction": 1}'),
]


@pytest.mark.parametrize(("method", "path", "body"), [c[1:] for c in ADMIN_BAD_BODIES],
                         ids=[c[0] for c in ADMIN_BAD_BODIES])
def test_bad_admin_json_gets_400(stack: StackProcess, admin: Any, method: str, path: str, body: bytes) -> None:
    r = admin.call(method, path, content=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] and "Traceback" not in r.text


def test_admin_body_is_refused_by_its_content_length_before_it_is_read(stack: StackProcess, admin: Any) -> None:
    """A declared 100 MB body gets its 400 at once: the server does not wait for (or buffer) the body."""
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (f"PUT /admin/faults/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.admin_token}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n{")
        sock.sendall(head.encode())
        reply = b""
        while b"KiB" not in reply and (chunk := sock.recv(65536)):  # the socket timeout bounds each wait
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400") and b"larger than 64 KiB" in reply, reply[:300]


def test_client_that_sends_half_a_body_does_not_hang_the_server(stack: StackProcess, admin: Any) -> None:
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\"")
    assert httpx.get(stack.url + "/health", timeout=5).status_code == 200
