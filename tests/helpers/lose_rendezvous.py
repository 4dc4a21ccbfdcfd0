"""Lose a rendezvous for real: torch's c10d rendezvous backend on a TCPStore whose server is
killed under it, as a slow or stalled peer's host loses it. Run as a script; it ends with
torch's own RendezvousConnectionError traceback (the text a study's log then holds)."""

import datetime
import multiprocessing as mp
import socket
import time

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend


def serve(port):
    st = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # noqa: F841
    time.sleep(60)

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
p = mp.get_context("fork").Process(target=serve, args=(port,)); p.start()
time.sleep(1)
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=3))
backend = C10dRendezvousBackend(store, "r")
backend.get_state()
p.kill(); p.join()
backend.get_state()
