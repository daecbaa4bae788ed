#!/usr/bin/env python3
"""The floor of one API request: N sequential `GET /`, a new connection each.

usage: api-floor.py SOCKET [N]    (N defaults to 500)

Works against any VMM serving Firecracker's API on a Unix socket (`spore vmm
--api-sock`, `firecracker --api-sock`); prints p10, p50 and p90 in
microseconds, from the request's send to its whole response.
"""
import socket
import statistics
import sys
import time


def one(path, request):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        t0 = time.perf_counter_ns()
        s.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("the VMM closed the connection mid-response")
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        while len(body) < length:
            chunk = s.recv(4096)
            if not chunk:
                raise RuntimeError("short response body")
            body += chunk
        return (time.perf_counter_ns() - t0) / 1000
    finally:
        s.close()


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[2])
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 500
    if n < 1:
        sys.exit("api-floor: N must be at least 1")
    request = b"GET / HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\r\n"
    try:
        ts = sorted(one(path, request) for _ in range(n))
    except (OSError, RuntimeError, ValueError) as e:
        sys.exit(f"api-floor: {path}: {e}")
    print(f"{path}: n={n} p10={ts[n // 10]:.1f} p50={statistics.median(ts):.1f} "
          f"p90={ts[9 * n // 10]:.1f} us")


main()
