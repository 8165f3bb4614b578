"""A small server run inside a sandbox by the port-proxy tests (standard
library only): ``GET /bytes?n=N`` streams N bytes, ``POST /sha256`` answers
the digest and length of its body (Content-Length or chunked),
``GET /ws`` is a WebSocket echo, anything else answers what the server saw
(method, path, headers) as JSON. Usage: ``python3 echo_server.py PORT``."""

import base64
import hashlib
import json
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CHUNK = 1 << 16


def pattern(n: int):
    block = bytes(range(256)) * (CHUNK // 256)
    while n > 0:
        piece = block[: min(n, CHUNK)]
        n -= len(piece)
        yield piece


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body_chunks(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return
                yield self.rfile.read(size)
                self.rfile.readline()
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            got = self.rfile.read(min(left, CHUNK))
            if not got:
                return
            left -= len(got)
            yield got

    def answer_json(self, obj, status=200):
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def seen(self):
        body = b"".join(self.body_chunks())
        self.answer_json({"method": self.command, "path": self.path,
                          "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body": body.decode(errors="replace")})

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/bytes":
            n = int(parse_qs(url.query)["n"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in pattern(n):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.write(b"0\r\n\r\n")
        elif url.path == "/ws":
            self.websocket()
        else:
            self.seen()

    def do_POST(self):
        if urlsplit(self.path).path == "/sha256":
            h, n = hashlib.sha256(), 0
            for piece in self.body_chunks():
                h.update(piece)
                n += len(piece)
            self.answer_json({"sha256": h.hexdigest(), "length": n})
        else:
            self.seen()

    do_PUT = do_DELETE = do_PATCH = seen

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 0x8:
                self.frame(0x8, data[:2])
                return
            if opcode == 0x9:
                self.frame(0xA, data)
            elif opcode in (0x1, 0x2):
                self.frame(opcode, data)

    def frame(self, opcode, data):
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        self.wfile.write(head + data)
        self.wfile.flush()


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Handler).serve_forever()
