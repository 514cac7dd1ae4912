"""``--insecure-dev`` (no bearer token) only on a loopback address, in both services: the real
``tidemark control`` and ``tidemark index`` commands refuse it on any other host with exit
status 2 and one line, and on loopback both print the same WARNING and serve without a
token."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
from control_support import TIDEMARK, free_port, wait_for

from tidemark.service_cli import is_loopback

pytestmark = pytest.mark.integration


def run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TIDEMARK_API_TOKEN", "TIDEMARK_INDEX_TOKEN")}
    return subprocess.run([TIDEMARK, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("service", ["control", "index"])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_insecure_dev_on_a_non_loopback_host_is_refused(service: str, host: str) -> None:
    r = run(service, "--insecure-dev", "--host", host, "--port", str(free_port()),
            "--bootstrap-servers", "127.0.0.1:1")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("error: --insecure-dev needs a loopback --host"), r.stderr
    assert repr(host) in lines[0]


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("example.com", False),
    ("", False)])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_index_service_warns_and_serves_without_a_token_on_loopback(broker: str, tmp_path) -> None:
    port = free_port()
    log = tmp_path / "index.log"
    env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_INDEX_TOKEN"}
    with open(log, "wb") as out:
        p = subprocess.Popen([TIDEMARK, "index", "--insecure-dev", "--host", "localhost", "--port", str(port),
                              "--bootstrap-servers", broker], stdout=out, stderr=out, env=env)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert p.poll() is None, log.read_text()
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=60, what="tidemark index --insecure-dev healthy")
        assert httpx.get(url + "/v1/tables").json() == {"tables": []}  # no token needed
        assert ("WARNING: --insecure-dev: the API accepts every request without a token; "
                "never expose this service beyond your machine") in log.read_text().splitlines()
    finally:
        p.terminate()
        p.wait(30)
