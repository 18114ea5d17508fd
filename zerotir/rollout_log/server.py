"""The local web viewer's HTTP server: the static page (``static/``) and the JSON API (``api``) over a rollouts folder.

``python -m zerotir rollouts RUN --serve [--port P]`` runs it on 127.0.0.1 (a free port unless ``--port``) and prints
the URL. Standard library only (``http.server``), one thread per request; the page is plain HTML, CSS and JavaScript
shipped in the package: nothing is built, fetched from a CDN or downloaded.

Routes (every query value is one string)::

    /                                         the page
    /static/<file>                            its script and style sheet
    /api/run                                  {"folder", "splits"}
    /api/steps?split=S                        one line per step (api.step_list)
    /api/step?split=S&step=K                  the step's prompt groups and tool names (api.step_view)
    /api/trajectory?split=S&step=K&id=R-I     one trajectory with its tokens (api.trajectory_view)

A bad request answers ``{"error": ...}`` with status 400 (a malformed value) or 404 (nothing of that name).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from zerotir.rollout_log import api

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".png": "image/png"}


def _param(query: dict[str, list[str]], name: str) -> str:
    values = query.get(name)
    if not values:
        raise api.ApiInputError(f"missing query parameter {name!r}", 400)
    return values[0]


def _step(query: dict[str, list[str]]) -> int:
    value = _param(query, "step")
    try:
        return int(value)
    except ValueError:
        raise api.ApiInputError(f"step={value!r}: must be an integer", 400) from None


def answer(reader: api.RunReader, path: str, query: dict[str, list[str]]) -> Any:
    """The JSON of one API route (``path`` after ``/api/``)."""
    if path == "run":
        return api.runs_splits(reader)
    if path == "steps":
        return api.step_list(reader, _param(query, "split"))
    if path == "step":
        return api.step_view(reader, _param(query, "split"), _step(query))
    if path == "trajectory":
        return api.trajectory_view(reader, _param(query, "split"), _step(query), _param(query, "id"))
    raise api.ApiInputError(f"no API route /api/{path}: the routes are run, steps, step, trajectory")


class _Handler(BaseHTTPRequestHandler):
    reader: api.RunReader  # set on the subclass ``make_server`` builds

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # quiet: the terminal shows the URL, not one line per request

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # a run still writing: a reload shows the new steps
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value, ensure_ascii=False).encode(), "application/json; charset=utf-8")

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urlparse(self.path)
        if url.path.startswith("/api/"):
            try:
                self._json(200, answer(self.reader, url.path[len("/api/"):], parse_qs(url.query)))
            except api.ApiInputError as error:
                self._json(error.status, {"error": str(error)})
            return
        name = "index.html" if url.path in ("/", "/index.html") else url.path.removeprefix("/static/")
        files = {p.name: p for p in STATIC.iterdir()}
        if name not in files:
            self._json(404, {"error": f"no page {url.path}"})
            return
        self._send(200, files[name].read_bytes(), _TYPES.get(files[name].suffix, "application/octet-stream"))


def make_server(folder: str | Path, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server of ``folder`` (a rollouts folder) bound to ``host:port`` (0: a free port), not yet serving."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port {port}: must be 0 (a free port) or 1..65535")
    handler = type("Handler", (_Handler,), {"reader": api.RunReader(folder)})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as error:
        raise OSError(f"--port {port}: cannot listen on {host}:{port} ({error.strerror}); choose another port or "
                      "leave --port out for a free one") from error
    server.daemon_threads = True
    return server


def url_of(server: ThreadingHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"


def serve_in_thread(folder: str | Path, port: int = 0) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start a server of ``folder`` on a daemon thread; stop it with ``server.shutdown()`` and ``server_close()``."""
    server = make_server(folder, port)
    thread = threading.Thread(target=server.serve_forever, name="zerotir-rollout-viewer", daemon=True)
    thread.start()
    return server, thread
