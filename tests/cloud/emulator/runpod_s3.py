"""RunPod's S3-compatible API over network volumes, as the emulated cloud serves it.

RunPod (docs.runpod.io/storage/s3-api) serves each datacenter's network volumes at
`https://s3api-<datacenter>.runpod.io/`: the bucket is the volume's id, the region the datacenter id,
the access key the user's id (`user_...`) and the secret the S3 API key (`rps_...`), signed with AWS
SigV4. The launcher reads a managed job's status.json and fetches its results this way
(launcher/backends/skypilot/files.py S3Volume: ListObjectsV2 with a delimiter, GetObject, PutObject).

Here a bucket is the volume's host directory (the same one its pods mount), so what a pod writes is
what a listing shows, as on RunPod. Served are the calls boto3 makes for those: ListObjectsV2 (path
style, `list-type=2`, prefix, delimiter, max-keys, continuation-token), GetObject, HeadObject,
PutObject (with boto3's aws-chunked body and trailing checksum over HTTP chunked transfer) and
DeleteObject, answering in S3's XML (docs.aws.amazon.com/AmazonS3/latest/API). The access key in
the SigV4 `Credential=` is checked; the signature itself is not recomputed.
"""

from __future__ import annotations

import hashlib
import io
import os
import ssl
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def _chunks(stream) -> bytes:
    """The data of a `size[;ext]\\r\\n data \\r\\n ... 0\\r\\n trailers \\r\\n` body: HTTP chunked
    transfer and S3's aws-chunked content share this framing."""
    out = bytearray()
    while True:
        line = stream.readline()
        if not line:
            break
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline() not in (b"\r\n", b"\n", b""):  # trailers (x-amz-checksum-*)
                pass
            break
        out += stream.read(size)
        stream.readline()
    return bytes(out)


class VolumeS3:
    def __init__(self, volume_dir: Callable[[str], Optional[Path]], access_key: str, log: Callable[[str], None]):
        """volume_dir(bucket): the host directory of the network volume with that id, None if none."""
        self.volume_dir, self.access_key, self.log = volume_dir, access_key, log
        self._server: ThreadingHTTPServer | None = None

    def start(self, bind: str, port: int, certfile: Path, keyfile: Path) -> None:
        self._server = ThreadingHTTPServer((bind, port), _handler(self))
        self._server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certfile), str(keyfile))
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="runpod-s3", daemon=True).start()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------------------ the bucket
    def path(self, bucket: str, key: str) -> Optional[Path]:
        """The file behind `key`, never outside the bucket's directory (None: no such bucket or key)."""
        root = self.volume_dir(bucket)
        if root is None or not key or key.startswith("/") or ".." in key.split("/"):
            return None
        return root / key

    def listing(self, bucket: str, prefix: str, delimiter: str) -> list[tuple[str, Optional[os.stat_result]]]:
        """Sorted (key, stat) of objects, (common prefix, None) of "folders" under `prefix`."""
        root = self.volume_dir(bucket)
        if root is None:
            return []
        start = root / prefix.rsplit("/", 1)[0] if "/" in prefix else root  # only the part that can match
        keys: dict[str, Optional[os.stat_result]] = {}
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            for name in filenames:
                full = Path(dirpath) / name
                key = full.relative_to(root).as_posix()
                if not key.startswith(prefix) or full.is_symlink() or not full.is_file():
                    continue
                rest = key[len(prefix):]
                if delimiter and delimiter in rest:
                    keys.setdefault(prefix + rest[:rest.index(delimiter) + len(delimiter)], None)
                else:
                    keys[key] = full.stat()
        return sorted(keys.items())


def _handler(s3: VolumeS3) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "emulated-runpod-s3"

        def log_message(self, fmt, *args) -> None:  # the emulator's api.log instead
            pass

        def _reply(self, code: int, body: bytes = b"", headers: Optional[dict] = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if body and "Content-Type" not in (headers or {}):
                self.send_header("Content-Type", "application/xml")
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body and self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, code: int, name: str, message: str) -> tuple[int, bytes, dict]:
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{name}</Code>'
                   f"<Message>{escape(message)}</Message></Error>").encode()
            return code, xml, {}

        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                raw = _chunks(self.rfile)
            else:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
            if "aws-chunked" in (self.headers.get("Content-Encoding") or ""):
                raw = _chunks(io.BytesIO(raw))
            return raw

        def _handle(self) -> None:
            url = urlsplit(self.path)
            bucket, _, key = url.path.lstrip("/").partition("/")
            key, query = unquote(key), {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            body = self._body() if self.command == "PUT" else b""
            auth = self.headers.get("Authorization") or ""
            if f"Credential={s3.access_key}/" not in auth:
                code, out, headers = self._error(403, "InvalidAccessKeyId", "The access key does not exist.")
            elif s3.volume_dir(bucket) is None:
                code, out, headers = self._error(404, "NoSuchBucket", f"no network volume {bucket}")
            else:
                code, out, headers = self._answer(bucket, key, query, body)
            s3.log(f"{self.client_address[0]} S3 {self.command} /{bucket}/{key} {code}")
            self._reply(code, out, headers)

        def _answer(self, bucket: str, key: str, query: dict, body: bytes) -> tuple[int, bytes, dict]:
            if self.command == "GET" and not key:
                return self._list(bucket, query)
            path = s3.path(bucket, key)
            if path is None:
                return self._error(400, "InvalidArgument", f"bad key {key!r}")
            if self.command in ("GET", "HEAD"):
                if not path.is_file() or path.is_symlink():
                    return self._error(404, "NoSuchKey", "The specified key does not exist.")
                st = path.stat()
                start, end = _byte_range(self.headers.get("Range"), st.st_size)
                with open(path, "rb") as f:  # a ranged GET (boto3's parallel download) reads its range only
                    f.seek(start)
                    data = f.read(end - start) if self.command == "GET" else b""
                extra = {"Content-Range": f"bytes {start}-{end - 1}/{st.st_size}"} if self.headers.get("Range") else {}
                return 206 if extra else 200, data, {
                    "Content-Type": "binary/octet-stream", "Accept-Ranges": "bytes", **extra,
                    "Content-Length": str(end - start),  # HEAD: the object's, with no body read
                    "ETag": f'"{st.st_size:x}-{int(st.st_mtime)}"',  # as the listing's: no md5 of GBs per range
                    "Last-Modified": formatdate(st.st_mtime, usegmt=True)}
            if self.command == "PUT":
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".s3-part")
                tmp.write_bytes(body)
                tmp.replace(path)
                return 200, b"", {"ETag": f'"{hashlib.md5(body).hexdigest()}"'}  # noqa: S324
            if self.command == "DELETE":
                path.unlink(missing_ok=True)
                return 204, b"", {}
            return self._error(405, "MethodNotAllowed", f"{self.command} is not served here")

        def _list(self, bucket: str, query: dict) -> tuple[int, bytes, dict]:
            if query.get("list-type") != "2":
                return self._error(400, "InvalidArgument", "only ListObjectsV2 (list-type=2) is served")
            prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
            max_keys = int(query.get("max-keys") or 1000)
            entries = s3.listing(bucket, prefix, delimiter)
            after = query.get("continuation-token") or query.get("start-after") or ""
            entries = [e for e in entries if e[0] > after] if after else entries
            page, more = entries[:max_keys], len(entries) > max_keys
            parts = [f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{NS}">',
                     f"<Name>{bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>",
                     f"<MaxKeys>{max_keys}</MaxKeys>", f"<IsTruncated>{'true' if more else 'false'}</IsTruncated>"]
            if delimiter:
                parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
            if more:
                parts.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
            for name, st in page:
                if st is None:
                    parts.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
                else:
                    parts.append(f"<Contents><Key>{escape(name)}</Key><LastModified>{_iso(st.st_mtime)}"
                                 f'</LastModified><ETag>"{st.st_size:x}-{int(st.st_mtime)}"</ETag>'
                                 f"<Size>{st.st_size}</Size><StorageClass>STANDARD</StorageClass></Contents>")
            parts.append("</ListBucketResult>")
            return 200, "".join(parts).encode(), {}

        do_GET = do_PUT = do_HEAD = do_DELETE = _handle

    return Handler


def _byte_range(header: Optional[str], size: int) -> tuple[int, int]:
    """[start, end) of an HTTP `Range: bytes=A-B` / `bytes=A-` (the forms boto3 sends), else the whole."""
    if not header or not header.startswith("bytes="):
        return 0, size
    a, _, b = header[6:].partition("-")
    start = int(a) if a else max(0, size - int(b))
    end = min(size, int(b) + 1) if a and b else size
    return min(start, size), end


def make_tls(dest: Path, names: list[str], ips: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) under dest: a throwaway CA that the user's
    boto3 trusts through AWS_CA_BUNDLE, and a certificate for `names` (e.g. s3api-eu-ro-1.runpod.io)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    dest.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "emulated RunPod test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = dest / "ca.pem", dest / "s3.pem", dest / "s3.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths
