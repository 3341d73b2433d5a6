"""The audit page's local server: the standard library's threading HTTP server on 127.0.0.1, no extra dependency.

    server = AuditServer(Audit(Path("runs/demo-data")), port=0).start()   # port 0: a free one
    print(server.url); ...; server.stop()

Routes: ``GET /`` the page (``audit_page/``: HTML, JS and CSS shipped in the package); ``GET /api/state`` the
sample with the verdicts so far; ``POST /api/verdict`` ``{"id", "human"}`` saves one verdict; ``GET /api/report``
writes and returns the agreement report; ``GET /api/report.png`` its plot. Errors are ``{"error": {"message"}}``
with a 4xx status. A POST must be ``application/json``, which a cross-site form cannot send without the browser's
preflight, so another site open in the reviewer's browser cannot record verdicts.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from selfrag.errors import SelfragError

from .audit import AUDIT_DIR, VERDICTS_FILE, Audit, AuditError
from .audit_report import write_report

logger = logging.getLogger(__name__)

PAGE = Path(__file__).parent / "audit_page"
_FILES = {"/": ("index.html", "text/html; charset=utf-8"), "/audit.js": ("audit.js", "text/javascript; charset=utf-8"),
          "/audit.css": ("audit.css", "text/css; charset=utf-8"), "/favicon.svg": ("favicon.svg", "image/svg+xml"),
          "/favicon.ico": ("favicon.svg", "image/svg+xml")}  # .ico: what a browser asks for on its own
MAX_BODY = 64 * 1024


class AuditServer:
    """One audit served on ``host:port`` in a background thread; ``stop()`` shuts it down and frees the port."""

    def __init__(self, audit: Audit, host: str = "127.0.0.1", port: int = 0) -> None:
        self.audit = audit
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"owner": self})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as error:
            raise OSError(f"cannot listen on {host}:{port}: {error.strerror}; pick another --port (0: a free one)"
                          ) from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://{host}:{self.port}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> AuditServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    owner: AuditServer
    server_version = "selfrag-audit"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        logger.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        path = self.path.split("?", 1)[0]
        audit = self.owner.audit
        if path in _FILES:
            name, kind = _FILES[path]
            self._send(HTTPStatus.OK, (PAGE / name).read_bytes(), kind)
        elif path == "/api/state":
            with self.owner.lock:
                self._json(HTTPStatus.OK, audit.state())
        elif path == "/api/report":
            with self.owner.lock:
                text, report = write_report(audit)
            self._json(HTTPStatus.OK, {"markdown": text, "report": report,
                                       "reviewed": len(audit.verdicts), "sampled": len(audit.sample)})
        elif path == "/api/report.png":
            plot = audit.data_dir / AUDIT_DIR / "report.png"
            if plot.is_file():
                self._send(HTTPStatus.OK, plot.read_bytes(), "image/png")
            else:
                self._error(HTTPStatus.NOT_FOUND, "no report yet; open the report first (GET /api/report)")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no page at {path}; the audit page is at /")

    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        if self.path != "/api/verdict":
            self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}; verdicts go to POST /api/verdict")
            return
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the verdict as application/json")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a verdict is at most {MAX_BODY} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, "the body is not JSON; send {\"id\": ..., \"human\": ...}")
            return
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not isinstance(body.get("human"), str):
            self._error(HTTPStatus.BAD_REQUEST, "send {\"id\": <record id>, \"human\": <label>} (both strings)")
            return
        try:
            with self.owner.lock:
                verdict = self.owner.audit.record(body["id"], body["human"])
                reviewed = len(self.owner.audit.verdicts)
        except SelfragError as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
            return
        self._json(HTTPStatus.OK, {"verdict": verdict, "reviewed": reviewed})

    def _json(self, status: HTTPStatus, data: Any) -> None:
        self._send(status, json.dumps(data, ensure_ascii=False).encode("utf-8"), "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._json(status, {"error": {"message": message}})

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


def run(data_dir: Path, report: bool = False, port: int | None = None, per_stratum: int | None = None,
        seed: int | None = None) -> int:
    """``selfrag audit``: print the report, or serve the page until Ctrl-C."""
    audit = Audit(Path(data_dir), per_stratum=per_stratum, seed=seed)
    if report:
        if not audit.verdicts:
            raise AuditError(f"no verdicts yet in {audit.data_dir / AUDIT_DIR / VERDICTS_FILE}; review some labels "
                             f"first: selfrag audit {audit.data_dir}")
        text, _ = write_report(audit)
        print(text, end="")
        print(f"written to {audit.data_dir / AUDIT_DIR}/report.md, report.json and report.png")
        return 0
    server = AuditServer(audit, port=0 if port is None else port)
    print(f"label audit of {audit.data_dir}: {len(audit.verdicts)} of {len(audit.sample)} sampled labels reviewed; "
          f"open {server.url} (Ctrl-C to stop)", flush=True)
    try:
        server.thread.run()  # serve in this thread until Ctrl-C
    except KeyboardInterrupt:
        print("stopped; run the same command to continue", flush=True)
    finally:
        server.httpd.server_close()
    return 0
