"""What both services show a person with a browser and no internet: ``/docs`` and ``/redoc``
reference only assets the service itself serves (a CDN link would leave the page blank
offline), and those assets load; ``/healthz`` names the installed version.

The services are the real apps on a real broker, served by uvicorn on a loopback port."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import httpx
import pytest
import uvicorn

from tidemark.control.app import create_app as control_app
from tidemark.control.controller import Controller
from tidemark.control.settings import ControlSettings
from tidemark.index.app import IndexService
from tidemark.index.app import create_app as index_app
from tidemark.version import tidemark_version

pytestmark = pytest.mark.integration


class _Links(HTMLParser):
    """Every URL a page makes the browser fetch: ``src``, ``href`` and ReDoc's ``spec-url``
    attributes, and the URL strings of Swagger UI's inline set-up script."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_script = tag == "script"
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            for quoted in data.split("'")[1::2] + data.split('"')[1::2]:
                if quoted.startswith(("http://", "https://", "/")):
                    self.urls.append(quoted)


def _serve(app) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "service did not start"
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(30)


@pytest.fixture(params=["control", "index"])
def service_url(request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    if request.param == "control":
        settings = ControlSettings(bootstrap_servers=kafka_bootstrap, state_dir=tmp_path / "control",
                                   api_token="t", registry_topic=f"tidemark.registry.pages-{time.time_ns()}")
        app = control_app(Controller(settings), "t")
    else:
        app = index_app(IndexService(kafka_bootstrap), "t")
    yield from _serve(app)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_pages_load_every_asset_from_the_service(service_url: str, page: str) -> None:
    r = httpx.get(service_url + page, timeout=10)
    assert r.status_code == 200
    links = _Links()
    links.feed(r.text)
    assert links.urls, f"{page} references no assets at all"
    for link in links.urls:
        absolute = urljoin(service_url + page, link)
        assert urlparse(absolute).netloc == urlparse(service_url).netloc, f"{page} loads {link} from elsewhere"
        got = httpx.get(absolute, timeout=10)
        assert got.status_code == 200, f"{page}: {link} -> {got.status_code}"
        assert got.content, f"{page}: {link} is empty"


def test_healthz_names_the_installed_version(service_url: str) -> None:
    body = httpx.get(service_url + "/healthz", timeout=10).json()
    assert body["status"] == "ok"
    assert body["version"] == tidemark_version() != "unknown"
