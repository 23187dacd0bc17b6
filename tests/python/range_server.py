"""A local object server for the stores prep reads by plain ranged GETs:
Google Cloud Storage's XML API (`gs://`, which object_store speaks to a
`gcs_base_url`) and a plain web server (`http://`, `https://`), on 127.0.0.1,
over a directory of files.

It answers HEAD and GET of `/BUCKET/KEY` (the key percent-decoded, as GCS
decodes it), honours `Range: bytes=a-b` with 206 and Content-Range (416
past the end), and sends what the clients read as an object's identity:
Content-Length, Last-Modified, a quoted ETag (the MD5 of the bytes) and
x-goog-generation. Everything else is 404 or 501. It counts each GET with its
range, so tests can see what a reader fetched. With `tls=(cert, key)` it
serves https.

The Python GCS emulators on PyPI implement the JSON API and answer the XML
API's HEAD with 501, which is why this one exists; S3 and Azure tests use
real emulators (moto, Azurite).
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import ssl
import threading
import urllib.parse
from pathlib import Path


class RangeServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # The streaming reader opens many connections at once; socketserver's
    # default backlog of 5 can turn a burst of them away on a loaded machine.
    request_queue_size = 128

    def __init__(self, root: Path, tls: tuple[Path, Path] | None = None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.gets: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.socket = context.wrap_socket(self.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server_address[1]}"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _file(self) -> Path | None:
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        path = (self.server.root / rel).resolve()
        if self.server.root.resolve() not in path.parents or not path.is_file():
            return None
        return path

    def _headers(self, path: Path, data: bytes) -> None:
        st = path.stat()
        self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
        self.send_header("ETag", '"' + hashlib.md5(data).hexdigest() + '"')
        self.send_header("x-goog-generation", str(st.st_mtime_ns))
        self.send_header("Accept-Ranges", "bytes")

    def _answer(self, body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        start, end, status = 0, len(data), 200
        wanted = self.headers.get("Range")
        if wanted and body:
            spec = wanted.strip().removeprefix("bytes=")
            a, _, b = spec.partition("-")
            start = int(a)
            end = min(len(data), int(b) + 1) if b else len(data)
            if start >= len(data) or start >= end:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self._headers(path, data)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if body:
            with self.server.lock:
                self.server.gets.append((urllib.parse.unquote(self.path), wanted or ""))
            self.wfile.write(data[start:end])

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)


def gcs_service_account(path: Path, server: RangeServer) -> Path:
    """A service-account file that points object_store's GCS client at
    `server`, with no OAuth (as object_store's own tests reach an emulator)."""
    import json

    path.write_text(json.dumps({"gcs_base_url": server.url, "disable_oauth": True, "client_email": "",
                                "private_key": "", "private_key_id": ""}))
    return path


def self_signed(dir: Path) -> tuple[Path, Path, Path]:
    """A certificate authority and a certificate for 127.0.0.1 it signed, made
    with openssl: (the authority's certificate, to trust through
    SSL_CERT_FILE; the server's certificate; its key). rustls refuses an
    authority's own certificate as a server's, so there are two."""
    import subprocess

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca, ca_key = dir / "ca.pem", dir / "ca-key.pem"
    cert, key, csr, ext = dir / "cert.pem", dir / "key.pem", dir / "cert.csr", dir / "cert.ext"
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=prep test authority",
        "-keyout", str(ca_key), "-out", str(ca))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2",
        "-extfile", str(ext), "-out", str(cert))
    return ca, cert, key


__all__ = ["RangeServer", "gcs_service_account", "self_signed"]
