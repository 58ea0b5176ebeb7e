"""A huge prompt does not stall the builtin stack's loop (issue 41, LOW): a prompt longer than the
context can hold by its size alone (more bytes than ``max_token_bytes`` x the context) is refused with
400 ``context_length_exceeded`` before it is tokenized. Today the 900 KB prompt is tokenized first,
holding the loop (and the GIL) 0.7-1.4 s here, 2.4-4.9 s on a busy box, every other stream waiting."""

from __future__ import annotations

import json
import random
import re
import socket
import time

import pytest

from chaos.stack.engine.tokenizer import Tokenizer
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)


def _words(size: int) -> str:
    rnd = random.Random(1)
    text = " ".join("".join(rnd.choices("abcdefghijklmnopqrstuvwxyz", k=rnd.randint(2, 9))) for _ in range(size // 5))
    return text[:size]


def _post(url: str, path: str, body: dict[str, object]) -> tuple[int, dict[str, object], float]:
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    took = time.perf_counter() - t0
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2]), took


@pytest.mark.parametrize("chat", [False, True])
def test_a_900_kb_prompt_is_refused_before_it_is_tokenized(stack: StackProcess, chat: bool) -> None:
    prompt = _words(900_000)
    body: dict[str, object] = {"model": "tiny", "max_tokens": 4, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    status, answer, took = _post(stack.url, "/v1/chat/completions" if chat else "/v1/completions", body)
    error = answer["error"]
    assert status == 400 and isinstance(error, dict) and error["code"] == "context_length_exceeded", answer
    # what only the refusal by size says (after tokenizing, the message counts tokens): never tokenized
    assert re.search(r"the prompt is 900\d{3} bytes, more than 4095 tokens", str(error["message"])), error
    assert took < 0.6, took  # today: 0.7-1.4 s here, 2.4-4.9 s on a busy box, the loop stalled throughout


def test_the_bound_never_refuses_a_prompt_that_fits() -> None:
    """Each token of the builtin vocabulary stands for at most ``max_token_bytes`` bytes, so a text of
    more bytes than that times N has at least N tokens: the early refusal is one the context makes anyway."""
    tok = Tokenizer.load()
    per_token = tok.max_token_bytes
    assert per_token == 67
    rnd = random.Random(7)
    samples = [_words(20_000), "a" * 5000, " " * 5000, "混沌工程的目标是在故障发生之前发现系统的弱点" * 50,
               "".join(chr(rnd.randint(32, 0x2FFF)) for _ in range(5000)), "<|assistant|>" * 300]
    vocab = tok._tok.get_vocab(with_added_tokens=True)
    samples += [tok.decode([i], skip_special_tokens=False) for i in sorted(vocab.values())]
    for text in samples:
        size = len(text.encode("utf-8"))
        assert len(tok.encode(text)) * per_token >= size, text[:40]
