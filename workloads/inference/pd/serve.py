"""Start a prefill and a decode instance, wait for both, warm the KV path, then serve the proxy.

    python -m workloads.inference.pd.serve '<json plan>'     (the vllm-pd or sglang-pd adapter builds the plan)

The plan's `bootstrap` ([host, port] of the prefill instance's bootstrap server) selects SGLang's
request protocol in the proxy; without it, vLLM's.

The orchestrator starts this in a session of its own, so both engines are in its process group
and are stopped with it. Each instance's output goes to its own log (the plan's `log`), which
the KV metrics and the KV-path verdict are read from. A decode (or prefill) instance that exits
or does not answer /health within the plan's ready_timeout_s ends this process with one line
naming it and its log, and exit code 3.

On two real nodes (server=vllm-pd with server.nnodes=2 outside the emulator) each node runs this:
node 0 with its prefill instance and the proxy, waiting for node 1's decode instance at the plan's
`remote` address; node 1 with its decode instance only (`"proxy": false`), which it then keeps
until node 0's proxy (the plan's `watch`) stops answering, or the instance exits.

Warm-up: the first P/D request after start-up may fail on NIXL's first handshake (the decode
worker waits at most 5 s, hard-coded, for the prefill's side channel, as seen on a CPU host),
so one P/D request goes through the proxy logic before the proxy listens, retried once; its
outcome (attempts, errors, seconds) is written to the plan's `warmup_path` for the record.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from workloads.core.ports import free_port
from workloads.inference.adapters.orchestrator import HeadWatch, probe
from workloads.inference.pd.proxy import Proxy

NOT_READY = 1  # a fault, as docs/reliability.md's table says (3 is a transport mismatch)
ROLES = ("prefill", "decode")
LABEL = "vllm-pd"  # the plan's `name`: server=vllm-pd or server=sglang-pd, in every line said here


def _tail(path: str, n: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start(role: str, inst: dict) -> subprocess.Popen:
    Path(inst["log"]).parent.mkdir(parents=True, exist_ok=True)  # node 1 may start before node 0 made it
    log = open(inst["log"], "ab")
    log.write(f"# {role}: {' '.join(inst['argv'])}\n".encode())
    log.flush()
    inst["offset"] = log.tell()  # what the instance writes from here is this start's
    # an emulated node's instance runs in that node's network namespace (`ip netns exec` execs the
    # engine in place: the Popen's pid is the engine's, in our process group, stopped with it)
    where = ["ip", "netns", "exec", inst["netns"]] if inst.get("netns") else []
    return subprocess.Popen(where + inst["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=os.environ | inst["env"])


def wait_ready(procs: dict[str, subprocess.Popen], plan: dict) -> None:
    """Every instance of the plan: this node's (`procs`) and another node's (`remote`, probed only)."""
    deadline = time.monotonic() + float(plan["ready_timeout_s"])
    waiting = {role for role in ROLES if role in plan}
    while waiting:
        for role in sorted(waiting):
            inst, p = plan[role], procs.get(role)
            where = f"{inst['host']}:{inst['port']}" if inst.get("remote") else f"port {inst['port']}"
            if probe(f"http://{inst['host']}:{inst['port']}/health") == 200:
                waiting.discard(role)
                print(f"{LABEL}: {role} instance ready on {where}", flush=True)
            elif p is not None and p.poll() is not None:
                raise NotReady(f"the {role} instance exited with code {p.returncode} before it was ready", inst)
            elif line := _fatal_line(inst["log"], inst.get("offset", 0)):
                raise NotReady(f"the {role} instance cannot start: {line}", inst)
        if waiting and time.monotonic() > deadline:
            role = sorted(waiting)[0]
            inst = plan[role]
            where = f" at {inst['host']}:{inst['port']} (another node's; is its worker running?)" if inst.get("remote") else ""
            raise NotReady(f"the {role} instance{where} did not answer /health within server.ready_timeout_s="
                           f"{plan['ready_timeout_s']:g} s", inst)
        time.sleep(0.5)


# Start-up failures after which a vLLM instance hangs instead of exiting: the NIXL handshake
# listener thread dies on a taken side-channel port and the engine waits for it for ever.
FATAL = ("Address already in use",)


def _fatal_line(log: str, offset: int = 0) -> str | None:
    """The first fatal line the log got after `offset` (a resumed run appends to the same log)."""
    from workloads.core.rundir import log_since

    text = log_since(log, offset)
    if text is None:
        return None
    return next((line.strip() for line in text.splitlines() if any(f in line for f in FATAL)), None)


class NotReady(Exception):
    def __init__(self, what: str, inst: dict):
        super().__init__(what)
        self.what, self.log = what, inst["log"]


def stop(procs: dict[str, subprocess.Popen], grace_s: float = 10.0) -> None:
    """Both instances, whatever state they are in (the orchestrator also stops our whole group)."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs.values():
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def keep(procs: dict[str, subprocess.Popen], watch: str | None = None, misses: int = 5) -> int:
    """A node without the proxy serves its instance until the instance exits (its code), or until
    node 0's proxy (`watch`, its /health), once seen up, stops answering `misses` times in a row:
    node 0's sweep is over, and this node stops its instance and exits 0, so that the job ends as
    its sweep did. (srun's --wait, which would end it otherwise, kills the task: a failed job.)"""
    head = HeadWatch(watch, misses) if watch else None
    while True:
        for role, p in procs.items():
            if p.poll() is not None:
                print(f"{LABEL}: the {role} instance exited with code {p.returncode}", flush=True)
                stop(procs)
                return p.returncode or 0
        if head and head.gone():
            print(f"{LABEL}: node 0's proxy ({watch}) stopped answering: its sweep is over; stopping this "
                  "node's instance", flush=True)
            stop(procs)
            return 0
        time.sleep(1)


async def warm_up(proxy: Proxy, plan: dict) -> dict:
    """One P/D request end to end through the proxy's own code, retried once."""
    body = {"model": plan["model_name"], "prompt": "warm up the kv path", "max_tokens": 2, "temperature": 0,
            "stream": True}
    runner = web.AppRunner(proxy.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    tries: list[dict] = []
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            t0 = time.perf_counter()
            try:
                async with s.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                                  timeout=aiohttp.ClientTimeout(total=plan["warmup_timeout_s"])) as r:
                    text = (await r.read()).decode(errors="replace")
                ok = r.status == 200 and '"error"' not in text and "[DONE]" in text
                tries.append({"ok": ok, "s": time.perf_counter() - t0, "error": None if ok else text[-300:]})
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                tries.append({"ok": False, "s": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"})
            if tries[-1]["ok"]:
                break
    await runner.cleanup()
    return {"attempts": len(tries), "ok": tries[-1]["ok"], "tries": tries}


def main(argv: list[str]) -> int:
    global LABEL
    plan = json.loads(argv[0])
    LABEL = plan.get("name", LABEL)
    try:
        held = hold(plan["host"], int(plan["port"])) if plan.get("proxy", True) else None
    except OSError as e:
        print(f"error: {LABEL}: server.port={plan['port']} on {plan['host']} cannot be bound for the proxy "
              f"({e.strerror}); stop what holds it or choose another server.port", flush=True)
        return NOT_READY
    procs = {role: start(role, plan[role]) for role in ROLES if role in plan and not plan[role].get("remote")}
    if plan.get("pids_path"):  # where the observer reads each node's link counters (its namespace's /proc/<pid>/net)
        Path(plan["pids_path"]).write_text(json.dumps({"proxy": os.getpid()} | {r: p.pid for r, p in procs.items()}))
    try:
        wait_ready(procs, plan)
    except NotReady as e:
        print(f"{LABEL}: {e.what}; the last lines of its log ({e.log}):\n{_tail(e.log)}", flush=True)
        print(f"error: {LABEL}: {e.what} (its log: {e.log})", flush=True)
        stop(procs)
        return NOT_READY
    if not plan.get("proxy", True):
        return keep(procs, plan.get("watch"))
    pre, dec = (f"http://{plan[r]['host']}:{plan[r]['port']}" for r in ROLES)
    boot = tuple(plan["bootstrap"]) if plan.get("bootstrap") else None  # SGLang's protocol
    proxy = Proxy(pre, dec, plan.get("timings_path"), boot)
    warm = asyncio.run(warm_up(Proxy(pre, dec, bootstrap=boot), plan))
    Path(plan["warmup_path"]).write_text(json.dumps(warm))
    print(f"{LABEL}: warm-up P/D request: {'ok' if warm['ok'] else 'FAILED'} after {warm['attempts']} attempt(s) "
          f"({', '.join(format(t['s'], '.2f') + ' s' for t in warm['tries'])})", flush=True)
    if not warm["ok"]:
        print(f"error: {LABEL}: the warm-up P/D request failed twice: {warm['tries'][-1]['error']}", flush=True)
        stop(procs)
        return NOT_READY
    web.run_app(proxy.app(), sock=held, print=None, access_log=None)
    return 0


def hold(host: str, port: int) -> socket.socket:
    """The proxy's port, bound now and listened on once both instances are warm: the instances
    take a minute to start, and an outgoing connection of theirs (or anyone's) could take the
    number meanwhile (seen: the proxy's bind failed after a 40-s start-up, EADDRINUSE). Bound
    but not listening, it refuses connections, so readiness probes still wait for the proxy."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's own bind does
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
