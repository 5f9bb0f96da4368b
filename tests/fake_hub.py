"""A local stand-in for the Hugging Face hub's HTTP API (``HF_ENDPOINT``), enough for ``snapshot_download``.

It serves one model repository from a folder: the revision lookup, the tree listing, and ``resolve`` HEAD/GET for
each file. ``slow`` throttles the largest file so a test can interrupt a download while it is in flight;
``sending`` is set once that file has begun to stream.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo_id: str, folder: Path, slow: bool = False):
        self.repo_id, self.slow = repo_id, slow
        self.files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        self.largest = max(self.files, key=lambda name: len(self.files[name]))
        self.sending = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, body: bytes, headers: dict[str, str], head: bool = False, throttle: bool = False) -> None:
                self.send_response(200)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                if head:
                    return
                if not throttle:
                    self.wfile.write(body)
                    return
                hub.sending.set()
                try:
                    for start in range(0, len(body), 1024):  # about 20 kB/s: a download that lasts seconds
                        self.wfile.write(body[start:start + 1024])
                        self.wfile.flush()
                        time.sleep(0.05)
                except (BrokenPipeError, ConnectionResetError):  # the client was stopped
                    pass

            def _route(self, head: bool) -> None:
                path = self.path.split("?")[0]
                api = f"/api/models/{hub.repo_id}"
                if path in (api, f"{api}/revision/main"):
                    info = {"id": hub.repo_id, "sha": COMMIT, "siblings": [{"rfilename": n} for n in hub.files]}
                    return self._send(json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                if path == f"{api}/tree/{COMMIT}":
                    tree = [{"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                            for n, b in hub.files.items()]
                    return self._send(json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
                for revision in ("main", COMMIT):
                    prefix = f"/{hub.repo_id}/resolve/{revision}/"
                    name = path[len(prefix):] if path.startswith(prefix) else None
                    if name in hub.files:
                        body = hub.files[name]
                        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(body).hexdigest()}"'}
                        return self._send(body, headers, head, throttle=hub.slow and name == hub.largest)
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._route(head=False)

            def do_HEAD(self) -> None:
                self._route(head=True)

        return Handler
