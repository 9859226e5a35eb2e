"""A loopback HTTP(S) server for the tests' stand-ins (IMDS, the EKS Pod Identity agent, the Kubernetes API server,
an installer download): one handler class, a free port on 127.0.0.1, served from a thread; and moto's AWS in server
mode on the same terms (moto_server)."""
from __future__ import annotations

import json
import logging
import ssl
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple


class QuietHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing and answers in one call."""

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, code: int, body: Any = b"", content_type: Optional[str] = None,
               headers: Optional[Dict[str, str]] = None) -> None:
        """`body`: bytes as they are, anything else as JSON; `headers`: more response headers (Retry-After, ...)."""
        if not isinstance(body, bytes):
            body, content_type = json.dumps(body).encode(), content_type or "application/json"
        self.send_response(code)
        if content_type:
            self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def json_body(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


class LoopbackServer:
    def __init__(self, handler: type, tls: Optional[Tuple[Path, Path]] = None):
        """`tls`: (certificate, key) to serve HTTPS with."""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's AWS in server mode on 127.0.0.1 (a free port, its request log off); yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
