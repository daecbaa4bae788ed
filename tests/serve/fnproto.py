#!/usr/bin/env python3
"""Talks spore's function invoke protocol (crates/spore-abi/src/function.rs) to a
function instance through its VMM's vsock Unix socket, for trying functions by hand:

    fnproto.py VSOCK_UDS PAYLOAD [PAYLOAD...]

Connects (CONNECT 21318), waits for Ready, sends each payload as an Invoke and
prints the result kind, body and log of each.
"""
import socket
import struct
import sys
import time

PORT = 0x5346
MAGIC = struct.unpack("<I", b"SPFN")[0]
HDR = struct.Struct("<IBBHIIQ")
KINDS = {1: "Ready", 2: "Invoke", 3: "ResultOk", 4: "ResultError"}


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def read_frame(s):
    magic, version, kind, _, len_a, len_b, arg = HDR.unpack(read_exact(s, HDR.size))
    if magic != MAGIC or version != 1:
        raise ValueError(f"bad frame header {magic:#x} v{version}")
    return KINDS.get(kind, kind), read_exact(s, len_a), read_exact(s, len_b), arg


def connect(uds, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(uds)
            s.sendall(f"CONNECT {PORT}\n".encode())
            line = b""
            while not line.endswith(b"\n"):
                c = s.recv(1)
                if not c:
                    raise EOFError("closed during CONNECT")
                line += c
            if not line.startswith(b"OK"):
                raise ConnectionError(line.decode(errors="replace").strip())
            return s
        except (OSError, EOFError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main():
    uds, payloads = sys.argv[1], sys.argv[2:]
    s = connect(uds)
    kind, _, _, init_us = read_frame(s)
    print(f"{kind} init_us={init_us}")
    for i, p in enumerate(payloads):
        rid = f"req-{i}".encode()
        body = p.encode()
        s.sendall(HDR.pack(MAGIC, 1, 2, 0, len(rid), len(body), 0) + rid + body)
        kind, body, log, ns = read_frame(s)
        print(f"{kind} handler_ns={ns} body={body.decode(errors='replace')} log={log.decode(errors='replace')!r}")


if __name__ == "__main__":
    main()
