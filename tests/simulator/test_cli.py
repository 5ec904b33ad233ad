"""``prefect-coder simulator`` as a real subprocess, reached over real sockets.

The command prints exactly three banner lines, ``export CODER_URL='...'``,
``CODER_SESSION_TOKEN`` and ``CODER_ORG_ID``, that a user pastes into a shell (or
evals); the token must appear nowhere else in its output, whatever requests it serves.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

COMMAND = Path(sys.executable).parent / "prefect-coder"
START_TIMEOUT = 20.0
URL_LINE = re.compile(r"export CODER_URL='http://127\.0\.0\.1:(\d+)'")
NAMES = ["CODER_URL", "CODER_SESSION_TOKEN", "CODER_ORG_ID"]


@dataclass
class Running:
    """A started simulator process and what it printed so far."""

    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The banner's settings, read as a shell reads the ``export`` lines."""
        found = {}
        for line in self.lines:
            export, assignment = shlex.split(line)
            assert export == "export", line
            name, value = assignment.split("=", 1)
            found[name] = value
        return found

    @property
    def url(self) -> str:
        return self.env["CODER_URL"]

    @property
    def token(self) -> str:
        return self.env["CODER_SESSION_TOKEN"]

    @property
    def org(self) -> str:
        return self.env["CODER_ORG_ID"]

    def stop(self) -> tuple[int, str, str]:
        """SIGTERM, wait for the exit; return the code and the rest of stdout and stderr."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=15)
        rest = self.proc.stdout.read().decode()
        errors = self.proc.stderr.read().decode()
        return code, rest, errors


def _read_line(proc: subprocess.Popen[bytes], deadline: float) -> str:
    """One stdout line, read straight from the pipe so nothing is buffered away."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no complete banner line in time; got {data!r}")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 1)
        if not chunk:
            raise AssertionError(f"stdout closed early (exit {proc.poll()}); got {data!r}")
        data += chunk
    return data.decode().rstrip("\n")


def _start(*args: str) -> Running:
    assert COMMAND.exists(), f"{COMMAND} is not installed"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODER_")}
    proc = subprocess.Popen(
        [str(COMMAND), "simulator", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=env,
    )
    running = Running(proc)
    deadline = time.monotonic() + START_TIMEOUT
    running.lines = [_read_line(proc, deadline) for _ in range(3)]
    return running


@pytest.fixture
def started() -> Iterator[list[Running]]:
    """Processes a test starts; any left running are killed afterwards."""
    processes: list[Running] = []
    yield processes
    for running in processes:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait(timeout=15)
        for pipe in (running.proc.stdout, running.proc.stderr):
            if pipe is not None:
                pipe.close()


def _check_banner(running: Running) -> int:
    assert list(running.env) == NAMES
    for line, (name, value) in zip(running.lines, running.env.items(), strict=True):
        assert line == f"export {name}='{value}'"  # always quoted, pasteable as is
    match = URL_LINE.fullmatch(running.lines[0])
    assert match, running.lines[0]
    port = int(match.group(1))
    assert port != 0  # the real port, not the one asked for
    assert str(uuid.UUID(running.org)) == running.org
    return port


def _create(http: httpx.Client, org: str, text: str) -> httpx.Response:
    body = {"organization_id": org, "content": [{"type": "text", "text": text}]}
    return http.post("/api/v2/chats", json=body)


def test_banner_chat_org_check_token_hygiene_and_sigterm(started: list[Running]) -> None:
    token = "cli-test-token-" + uuid.uuid4().hex
    running = _start("--token", token)
    started.append(running)
    _check_banner(running)
    assert running.lines[1] == f"export CODER_SESSION_TOKEN='{token}'"

    headers = {"Coder-Session-Token": running.token}
    with httpx.Client(base_url=running.url, headers=headers, timeout=10) as http:
        created = _create(http, running.org, "hello from the cli test")
        assert created.status_code == 201, created.text
        chat = created.json()
        assert chat["organization_id"] == running.org
        assert chat["title"]
        fetched = http.get(f"/api/v2/chats/{chat['id']}")
        assert fetched.status_code == 200
        assert fetched.json()["id"] == chat["id"]

        elsewhere = _create(http, str(uuid.uuid4()), "wrong org")
        assert elsewhere.status_code == 403
        assert elsewhere.json()["message"] == "You are not a member of the specified organization."
        assert [c["id"] for c in http.get("/api/v2/chats").json()] == [chat["id"]]

        bad = http.get("/api/v2/chats", headers={"Coder-Session-Token": token + "-wrong"})
        assert bad.status_code == 401
        anonymous = httpx.get(running.url + "/api/v2/chats", timeout=10)
        assert anonymous.status_code == 401
        admin = http.get("/simulator/v1/config")
        assert admin.status_code == 200
        assert token not in admin.text
        assert (
            http.get("/simulator/v1/config", headers={"Coder-Session-Token": "x"}).status_code
            == 401
        )

    code, rest, errors = running.stop()
    assert code == 0  # a clean stop on SIGTERM
    assert rest == ""  # nothing after the banner
    assert token not in errors
    assert "Traceback" not in errors
    assert sum(line.count(token) for line in running.lines) == 1


def test_generated_token_is_printed_and_works(started: list[Running]) -> None:
    running = _start()
    started.append(running)
    _check_banner(running)
    token = running.token
    assert len(token) >= 16
    headers = {"Coder-Session-Token": token}
    with httpx.Client(base_url=running.url, headers=headers, timeout=10) as http:
        ok = http.get("/api/v2/chats")
        assert ok.status_code == 200
        assert ok.json() == []
        created = _create(http, running.org, "generated")
        assert created.status_code == 201
        assert [c["id"] for c in http.get("/api/v2/chats").json()] == [created.json()["id"]]
        refused = http.get("/api/v2/chats", headers={"Coder-Session-Token": token[:-1]})
        assert refused.status_code == 401
    code, rest, errors = running.stop()
    assert code == 0
    assert rest == ""
    assert token not in errors


def test_port_zero_gives_each_process_its_own_free_port(started: list[Running]) -> None:
    first = _start("--token", "first-token-abcdef")
    started.append(first)
    second = _start("--token", "second-token-abcdef")
    started.append(second)
    ports = {_check_banner(first), _check_banner(second)}
    assert len(ports) == 2
    assert first.org != second.org
    for running in (first, second):
        response = httpx.get(
            running.url + "/api/v2/chats",
            headers={"Coder-Session-Token": running.token},
            timeout=10,
        )
        assert response.status_code == 200
    # Each process only knows its own token.
    crossed = httpx.get(
        first.url + "/api/v2/chats", headers={"Coder-Session-Token": second.token}, timeout=10
    )
    assert crossed.status_code == 401
    for running in (first, second):
        code, _, errors = running.stop()
        assert code == 0
        assert "Traceback" not in errors


def test_banner_evals_in_a_real_shell_even_with_quotes_in_the_token(
    started: list[Running],
) -> None:
    token = 'it\'s a "token" $HOME `x` ' + uuid.uuid4().hex
    running = _start("--token", token)
    started.append(running)
    assert [shlex.split(line)[1].split("=", 1)[0] for line in running.lines] == NAMES
    printed = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$BANNER" && printf "%s\\0" "$CODER_URL" "$CODER_SESSION_TOKEN" "$CODER_ORG_ID"',
        ],
        env={"PATH": os.environ["PATH"], "BANNER": "\n".join(running.lines)},
        capture_output=True,
        check=True,
    )
    url, shell_token, org, _ = printed.stdout.decode().split("\0")
    assert shell_token == token
    assert (url, org) == (running.url, running.org)
    assert URL_LINE.fullmatch(f"export CODER_URL='{url}'")
    response = httpx.get(
        url + "/api/v2/chats", headers={"Coder-Session-Token": shell_token}, timeout=10
    )
    assert response.status_code == 200
    code, _, errors = running.stop()
    assert code == 0
    assert "Traceback" not in errors
