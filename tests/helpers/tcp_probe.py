"""One TCP connection between two emulated nodes: a listener in one namespace, a client in
another that must read its greeting. Proves the path routes, not only that links exist."""

from __future__ import annotations

import subprocess
import sys

LISTEN = """import socket, sys
s = socket.create_server((sys.argv[1], 7777)); print("listening", flush=True)
c, _ = s.accept(); c.sendall(b"hello"); c.close()"""
CONNECT = """import socket, sys
print(socket.create_connection((sys.argv[1], 7777), timeout=10).recv(5).decode())"""


def tcp_hello(server_ns: str, client_ns: str, addr: str) -> None:
    """Listen on `addr` in `server_ns`, connect from `client_ns`; assert the greeting arrived."""
    server = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", LISTEN, addr],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        p = subprocess.run(["ip", "netns", "exec", client_ns, sys.executable, "-c", CONNECT, addr],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and p.stdout.strip() == "hello", p.stdout + p.stderr
    finally:
        server.kill()
        server.wait()
