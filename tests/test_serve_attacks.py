"""No request may take the service down: a real server (`python -m seq2seq.serve`, on a free
loopback port, for the checkpoint and for its CTranslate2 export), its address space capped a
few GiB above its idle size, receives each request that once made it search for minutes or
grow until the kernel ended it, and after each answers /health and a normal /translate as
before. Then the pieces one at a time: the memory estimate, the deadline that stops a search
between its steps, and a lone surrogate."""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import time
from pathlib import Path

import pytest
from helpers import ServeProcess

httpx = pytest.importorskip("httpx") if not os.environ.get("CI") else __import__("httpx")
if not os.environ.get("CI"):
    pytest.importorskip("fastapi")

TIMEOUT_S = 2  # the attacked servers' --timeout: a body or an answer later than this is refused
HEADROOM = 3 * 2**30  # the address space the server may grow by: 3 GiB over its idle size


@pytest.fixture(scope="module")
def ckpt(trained) -> str:
    return trained[0]["best_checkpoint"]


@pytest.fixture(scope="module")
def exported(ckpt: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    if not os.environ.get("CI"):
        pytest.importorskip("ctranslate2")
    from seq2seq.export import export

    return str(export(ckpt, tmp_path_factory.mktemp("ct2") / "model"))


def capped(server: ServeProcess) -> ServeProcess:
    """The ready server with its address space limited to its idle size plus HEADROOM: a
    request that made it allocate past that would fail, not grow it to the machine's size."""
    pid = server.process.pid
    status = Path(f"/proc/{pid}/status").read_text()
    idle = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmSize")))
    limit = idle * 1024 + HEADROOM
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    return server


def raw_request(url: str, head: str, body_parts, wait_s: float = 30) -> tuple[str, int]:
    """Send a request by hand (headers, then each part of the body as it comes), stopping as
    soon as the server answers; (what it answered, body bytes sent). A server that closes the
    connection while the body still comes may reset it before its answer is read: then ''."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=wait_s) as sock:
        sock.sendall(head.encode())
        try:
            # A server may answer from the headers alone: a moment for that, then the body.
            for index, part in enumerate(body_parts):
                if select.select([sock], [], [], 0.5 if index == 0 else 0)[0]:
                    break  # the server has answered (or closed)
                sock.sendall(part)
                sent += len(part)
            deadline = time.monotonic() + wait_s
            answer = b""
            while time.monotonic() < deadline and b"\r\n\r\n" not in answer:
                if not select.select([sock], [], [], deadline - time.monotonic())[0]:
                    break
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            if b"\r\n\r\n" in answer:  # the rest of a short JSON body
                sock.settimeout(2)
                try:
                    while chunk := sock.recv(65536):
                        answer += chunk
                except (TimeoutError, OSError):
                    pass
        except (ConnectionResetError, BrokenPipeError):
            return "", sent
    return answer.decode("utf-8", "replace"), sent


def status_and_error(answer: str) -> tuple[int, str]:
    head, _, body = answer.partition("\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(body[body.index("{") :])["error"]


def gigabyte_body():
    """1 GiB of JSON, chunked (Transfer-Encoding: chunked), made as it is sent."""
    chunk = b'"' + b"7 " * 32_000 + b'",'
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    for _ in range(2**30 // len(chunk)):
        yield framed


def slow_body():
    """A body that trickles a byte every 0.2 s and never ends (a slowloris)."""
    yield b'{"src": "'
    while True:
        time.sleep(0.2)
        yield b"1"


ATTACKS = ["beam", "n_best", "max_len", "long_sentences", "widest_allowed", "gigabyte_body",
           "declared_gigabyte", "lone_surrogate", "slow_body"]  # fmt: skip


def attack(url: str, name: str) -> tuple[int, str]:
    """(status, error or answer) for one attack."""
    if name == "beam":
        response = httpx.post(f"{url}/translate", json={"src": "1 2", "beam": 10**6}, timeout=60)
    elif name == "n_best":
        body = {"src": "1 2", "n_best": 10**6}
        response = httpx.post(f"{url}/translate", json=body, timeout=60)
    elif name == "max_len":
        response = httpx.post(f"{url}/translate", json={"src": "1 2", "max_len": 10**9},
                              timeout=60)  # fmt: skip
    elif name == "long_sentences":  # 64 sentences of 20,000 characters at the widest beam
        body = {"src": ["3 " * 10_000] * 64, "beam": 64, "truncate": True}
        response = httpx.post(f"{url}/translate", json=body, timeout=60)
    elif name == "widest_allowed":  # the most the limits let through: 64 sentences, 19,200
        # characters, each cut to the model's 64 positions, at beam and n-best 64
        body = {"src": ["3 " * 150] * 64, "beam": 64, "n_best": 64, "truncate": True}
        response = httpx.post(f"{url}/translate", json=body, timeout=60)
    elif name == "lone_surrogate":
        content = '{"src": "\\ud800 x"}'
        response = httpx.post(f"{url}/translate", content=content,
                              headers={"Content-Type": "application/json"}, timeout=60)  # fmt: skip
    else:
        host = url.removeprefix("http://")
        if name == "gigabyte_body":
            framing, parts = "Transfer-Encoding: chunked", gigabyte_body()
        elif name == "declared_gigabyte":
            framing, parts = f"Content-Length: {2**30}", gigabyte_body()
        else:
            framing, parts = "Content-Length: 100000", slow_body()
        head = (f"POST /translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
                f"\r\n{framing}\r\n\r\n")  # fmt: skip
        answer, sent = raw_request(url, head, parts)
        assert sent < 64 * 2**20, f"the server read {sent:,} bytes of a body it must refuse"
        if not answer:  # reset while the body still came: refused all the same
            return 0, "reset"
        return status_and_error(answer)
    body = response.json()
    return response.status_code, body.get("error") or str(body["tgt"])


EXPECTED = {
    "beam": ({413}, "beam 1000000 is more than this server's --max-beam 64"),
    "n_best": ({413}, "n_best 1000000 is more than this server's --max-beam 64"),
    "max_len": ({200}, None),  # cut at the model's positions: a short answer
    "long_sentences": ({413}, "bytes, more than this server's --max-body 1,048,576"),
    # Answered, or past the deadline (a slow machine): then its search stops between steps.
    "widest_allowed": ({200, 504}, None),
    "gigabyte_body": ({413}, "more than this server's --max-body 1,048,576"),
    "declared_gigabyte": ({413}, "the body has 1,073,741,824 bytes, more than this server's"),
    "lone_surrogate": ({422}, "src[0] is not valid text: character 0 is a lone surrogate"),
    "slow_body": ({408}, f"the body did not arrive within the server's --timeout of {TIMEOUT_S} s"),
}


def still_serves(url: str, normal: str) -> None:
    health = httpx.get(f"{url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    answer = httpx.post(f"{url}/translate", json={"src": "4 1 5"}, timeout=30)
    assert answer.status_code == 200 and answer.json()["tgt"] == normal


def test_no_request_takes_the_server_down(ckpt: str, exported: str) -> None:
    """Both backends, started together: each attack gets its answer, and the server goes on."""
    servers = {
        "checkpoint": ServeProcess(ckpt, "--timeout", str(TIMEOUT_S)),
        "export": ServeProcess("--model", exported, "--timeout", str(TIMEOUT_S)),
    }
    try:
        for backend, server in servers.items():
            url = capped(server.ready()).url
            normal = httpx.post(f"{url}/translate", json={"src": "4 1 5"}, timeout=30).json()
            for name in ATTACKS:
                status, said = attack(url, name)
                statuses, message = EXPECTED[name]
                if said != "reset":  # a body refused mid-stream may reset the connection first
                    assert status in statuses, (backend, name, status, said)
                    assert message is None or message in said, (backend, name, said)
                    assert "\n" not in said
                else:
                    assert name in ("gigabyte_body", "slow_body"), (backend, name)
                still_serves(url, normal["tgt"])
            assert server.process.poll() is None, "".join(server.output)[-3000:]
    finally:
        for server in servers.values():
            server.stop()
            assert "Traceback" not in "".join(server.output), "".join(server.output)[-3000:]
