"""procnet reads /proc the way `ss -tnp` does: checked against real sockets of this process
and of a child, not against hand-written tables."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from workloads.fabric import procnet


def test_hex_addr_reads_both_families():
    assert procnet.hex_addr("0100007F:1F90") == ("127.0.0.1", 8080)
    # ::1 as /proc/net/tcp6 prints it: four 32-bit words, each in host (little-endian) order
    assert procnet.hex_addr("00000000000000000000000001000000:0050") == ("::1", 80)
    # an IPv4-mapped address reads as the IPv4 one
    assert procnet.hex_addr("0000000000000000FFFF00000100007F:0016") == ("127.0.0.1", 22)


def test_socket_table_sees_this_process_listen_and_connection():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as cli:
            peer, _ = srv.accept()
            with peer:
                table = procnet.socket_table()
                assert ["127.0.0.1", port] in table["listen"]
                assert [list(cli.getsockname()), ["127.0.0.1", port]] in table["established"]
                assert table["addresses"].get("127.0.0.1") == "lo"


def test_listeners_names_the_process_that_holds_the_port():
    child = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                              "s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1], flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True, env={**os.environ, "X_PROCNET": "1"})
    try:
        port = int(child.stdout.readline())
        assert procnet.listeners(port) == [child.pid]
        assert procnet.process_cmdline(child.pid)[0] == sys.executable
        assert procnet.process_title(child.pid) == sys.executable
        assert procnet.process_env(child.pid, ["X_PROCNET", "X_UNSET"]) == {"X_PROCNET": "1", "X_UNSET": None}
    finally:
        child.kill()
        child.wait()
    assert procnet.listeners(port) == []


def test_a_process_that_is_gone_reads_as_nothing():
    gone = int(open("/proc/sys/kernel/pid_max").read())  # pids are below pid_max: never a live one
    assert procnet.process_cmdline(gone) is None and procnet.process_title(gone) == ""
    assert procnet.process_env(gone, ["PATH"]) == {}
