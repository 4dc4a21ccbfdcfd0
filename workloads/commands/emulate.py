"""The emulate command: run a workload's ranks across an emulated fabric on one Linux machine
(needs root). The fabric itself — namespaces, veths, bridges, leaf-spine routers, tc shaping —
is workloads/fabric/netns.py; this half composes the run's config, builds the fabric, starts
the noise (workloads/fabric/noise.py) and one torchrun agent per namespace (static rendezvous:
--node_rank, --master_addr = node 0's veth address), so Gloo's traffic between "nodes" crosses
a link of known rate, and tears everything down afterwards — also after a failure, Ctrl-C or
SIGTERM.

    python launch/emulate.py launch/train.py fabric=emu-100m
    python launch/emulate.py --nodes 4 launch/collectives.py fabric=emu-1g
    python launch/emulate.py --jobs 2 launch/collectives.py fabric=emu-leafspine
    python launch/emulate.py launch/infer.py fabric=emu-100m server.tp=2

Served inference is the one entry point that does not run in the namespaces: its load
generator runs on this host, and the engine it starts puts its TP ranks in the namespaces —
the reference engine one torchrun agent per namespace (`--serve`), vLLM's and SGLang's node i's
own command in namespace i (`--serve-nodes`); the API server answers on an unshaped veth from this host
into node 0, so only the engine's all_reduces cross the shaped link. server=vllm-pd puts its
prefill instance (and its proxy) in node 0 and its decode instance in node 1, so what crosses
the shaped link is each request's KV cache (workloads/inference/adapters/vllm_pd.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from workloads import CONF_DIR, catalog
from workloads.commands.entry import refuse_other_workloads
from workloads.core import forkrank
from workloads.core.errors import UsageError, say
from workloads.fabric import faults, noise
from workloads.fabric.emuplan import faults_of, spec_from_overrides
from workloads.fabric.kept import attach
from workloads.fabric.netns import (
    IFNAME,
    NODES_ENV,
    PREFIX,
    EmuSpec,
    Topology,
    emulated_nodes,
    enter,
    require_root,
)
from workloads.inference.adapters import check_emulated

MASTER_PORT = 29500      # free by construction: node 0's namespace is new
AGENT_MODULE = "workloads.commands.emulate"  # `python -m` of a node's agent (agent_argv)

def agent_argv(python: str, spec: EmuSpec, node: int, nproc: int, entry: str, overrides: Sequence[str],
               job: Sequence[int] | None = None) -> list[str]:
    """One torchrun agent for `node`, static rendezvous on node 0's veth address (run by
    agent_main below: torchrun's own machinery, a failed rank reported in one line). `job`: the
    nodes of this node's job when several share the fabric (their first node hosts its rendezvous)."""
    job = list(range(spec.nodes)) if job is None else list(job)
    return [python, "-m", AGENT_MODULE, "--agent", f"--nnodes={len(job)}",
            f"--node_rank={job.index(node)}", f"--nproc_per_node={nproc}", f"--master_addr={spec.addr(job[0])}",
            f"--master_port={MASTER_PORT}", f"--local_addr={spec.addr(node)}", "--max_restarts=0", entry, *overrides]


def run_agents(topo: Topology, nproc: int, entry: str, overrides: Sequence[str], timeout_s: float,
               python: str = sys.executable, env: Mapping[str, str] | None = None) -> int:
    """Start one torchrun agent per namespace, wait for all, return the first failure's exit
    code (0 when all succeeded). A timeout or Ctrl-C stops every agent."""
    base = _node_env(os.environ if env is None else env, topo.tag) | topo.env()
    argvs = [agent_argv(python, topo.spec, i, nproc, entry, overrides) for i in range(topo.spec.nodes)]
    return run_in_nodes(topo.nodes, argvs, [base] * len(argvs), timeout_s)


def _node_env(env: Mapping[str, str], tag: str) -> dict[str, str]:
    """What every process in a node gets: Gloo on the emulated link, one thread per rank, and
    one run id for all nodes (static rendezvous has no shared id to derive it from)."""
    base = dict(env)
    base.setdefault("FABRICBENCH_RUN_ID", f"emu-{time.strftime('%Y%m%d-%H%M%S')}-{tag}")
    base.setdefault("OMP_NUM_THREADS", "1")
    base["GLOO_SOCKET_IFNAME"] = IFNAME
    return base


def run_jobs(topo: Topology, k: int, nproc: int, entry: str, overrides: Sequence[str], timeout_s: float,
             output_root: str, fabric: str) -> int:
    """K concurrent jobs on disjoint nodes (workloads/fabric/jobs.py): started together, each its
    own world; their JCTs, primary metrics and Jain's fairness over them printed and written."""
    from workloads.fabric import jobs

    groups = jobs.split(topo.spec.nodes, k)
    base = _node_env(os.environ, topo.tag) | topo.env()
    argvs, envs, run_ids = [None] * topo.spec.nodes, [None] * topo.spec.nodes, []
    for j, nodes in enumerate(groups):
        mine, named = jobs.job_overrides(overrides, j)
        run_ids.append(named or f"{base['FABRICBENCH_RUN_ID']}-job{j}")
        for i in nodes:
            argvs[i] = agent_argv(sys.executable, topo.spec, i, nproc, entry, mine, job=nodes)
            envs[i] = base | {"FABRICBENCH_RUN_ID": run_ids[j]}
    ended: dict[int, float] = {}
    start = time.monotonic()
    code = run_in_nodes(topo.nodes, argvs, envs, timeout_s, ended=ended, independent=groups)
    per_job = []
    for j, nodes in enumerate(groups):
        metric, value, status = jobs.primary_of(Path(output_root) / run_ids[j])
        per_job.append({"job": j, "nodes": nodes, "run_id": run_ids[j], "status": status,
                        "exit_code": max((ended.get(i, (None, 124))[1] for i in nodes), key=abs),
                        "jct_s": max(ended.get(i, (time.monotonic(), 0))[0] for i in nodes) - start,
                        "metric": metric, "value": value})
    named = [o.split("=", 1)[1] for o in overrides if o.startswith("fabric.name=")]
    summary = jobs.summarize(per_job) | {"entry": entry, "fabric": topo.describe(),
                                         "fabric_name": named[-1] if named else fabric}
    for line in jobs.rows(summary):
        print(line, flush=True)
    print(f"jobs summary: {jobs.write(summary, output_root, topo.tag)}", flush=True)
    return code


def run_in_nodes(nodes: Sequence[str], argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
                 timeout_s: float, ended: dict[int, tuple[float, int]] | None = None,
                 independent: Sequence[Sequence[int]] | None = None) -> int:
    """`argvs[i]` in namespace `nodes[i]` (`ip netns exec`: the namespace's network, and a /sys
    that shows its interfaces), each in a session of its own; wait for all, stop all when one
    fails, times out or we are interrupted, and return the first failure's exit code."""
    procs: list[subprocess.Popen] = []
    forked = _fork_agents(argvs)
    try:
        with _signals_deferred():
            for i, (ns, argv, env) in enumerate(zip(nodes, argvs, envs)):
                p = forkrank.module(argv, dict(env), f"fb-agent{i}", enter=lambda ns=ns: enter(ns)) \
                    if forked and _is_agent(argv) else None
                # else `ip netns exec`, not bare nsenter: it also gives the process a mount namespace
                # whose /sys shows this namespace's interfaces (preflight reads them there).
                procs.append(p or subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=dict(env),
                                                   start_new_session=True))
        deadline = time.monotonic() + timeout_s
        codes: dict[int, int] = {}
        while len(codes) < len(procs):
            for i, p in enumerate(procs):
                if i not in codes and p.poll() is not None:
                    codes[i] = p.returncode
                    if ended is not None:
                        ended[i] = (time.monotonic(), p.returncode)
            if any(codes.values()):
                if not independent:
                    break  # one node failed: the others would wait for it until their timeout
                for job in independent:  # concurrent jobs: a failed job's nodes stop, the others run on
                    if any(codes.get(i) for i in job):
                        for i in job:
                            if i not in codes and procs[i].poll() is None:
                                _killpg(procs[i], signal.SIGTERM)
            if time.monotonic() > deadline:
                print(f"error: emulated run exceeded {timeout_s:g}s; stopping all agents", file=sys.stderr)
                return 124
            time.sleep(0.2)
        bad = {i: c for i, c in codes.items() if c}
        if bad:
            i, c = min(bad.items())
            print(f"error: node {i} ({nodes[i]}) exited with code {c}; its message is above", file=sys.stderr)
            return c if c > 0 else 1
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                _killpg(p, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # The agent still waits (torchrun gives its ranks 30 s after SIGTERM); its ranks live
                # in sessions of their own, and one blocked in a collective across a dead link runs no
                # handler: killed with the agent, not orphaned holding our caller's pipes.
                for rank in _children(p.pid):
                    _killpg_pid(rank, signal.SIGKILL)
                _killpg(p, signal.SIGKILL)
                p.wait(timeout=5)


def _is_agent(argv: Sequence[str]) -> bool:
    """`argv` is a node's torchrun agent (agent_argv), not an engine's or a load generator's."""
    return list(argv[2:4]) == [AGENT_MODULE, "--agent"]


def _fork_agents(argvs: Sequence[Sequence[str]]) -> bool:
    """Whether the nodes' torchrun agents start as forks of this process (entering their namespace
    as `ip netns exec` would: netns.enter) with torch and what every rank imports loaded once here,
    not as one fresh interpreter per node importing them again (~5 s of CPU each: 35 s per run of
    an 8-node emulation). Each agent then forks its ranks (core/forkrank.py). FB_RANK_START=exec
    keeps `ip netns exec` and fresh interpreters for both."""
    if forkrank.mode() != "fork" or not forkrank.can_fork():
        return False
    if not any(_is_agent(a) for a in argvs):
        return False
    from workloads.commands.entry import _warm

    forkrank.warm(("torch", "torch.distributed.run", *_warm("")))
    return True


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C or SIGTERM while the agents start is acted on once every started one is in the
    list the cleanup stops: raised inside Popen, after its fork, it orphaned that agent, which
    held the caller's pipes open (a SIGTERM test hung twice). Main thread only, as signals are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if pending:
        raise KeyboardInterrupt


def _killpg(p: subprocess.Popen, sig: int) -> None:
    _killpg_pid(p.pid, sig)


def _killpg_pid(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (/proc)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _sigterm_as_interrupt(signum, frame):  # SIGTERM cleans up like Ctrl-C, and ends 143 as every entry point does
    from workloads.core.signals import Terminated

    raise Terminated


def add_arguments(ap) -> None:
    """`fabricbench emulate ...` and launch/emulate.py share this parser."""
    import argparse

    ap.description = ("Run a fabricbench entry point across emulated nodes (network namespaces joined by "
                      "shaped veth links), one torchrun agent per namespace. Needs root.")
    ap.add_argument("--nodes", type=int, help="namespaces (overrides fabric.emulate.nodes)")
    ap.add_argument("--nproc-per-node", type=int, default=1, help="ranks per namespace [1]")
    ap.add_argument("--rate", help="tc rate, e.g. 100mbit (overrides fabric.emulate.rate; 'none' = unshaped)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before every agent is stopped [900]")
    ap.add_argument("--jobs", type=int, default=1,
                    help="concurrent jobs on disjoint nodes sharing the fabric: JCT and Jain's fairness [1]")
    ap.add_argument("entry", help="launch/train.py, launch/collectives.py, launch/link.py or launch/infer.py")
    ap.add_argument("overrides", nargs=argparse.REMAINDER, help="Hydra overrides, e.g. fabric=emu-100m")


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="launch/emulate.py")
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args, conf_dir: str | None = None) -> int:
    from workloads.core import timeline

    timeline.begin()  # the run's clock: namespaces, links and agents are its start-up too
    old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    died: list[str] = []  # the delay line's death, said once by its watcher
    try:
        plan = _plan(args, conf_dir or CONF_DIR)
        require_root()
        return _run_planned(args, plan, died)
    except UsageError as e:  # a TopologyError too: the namespaces made so far are gone, Topology tore them down
        return say(e)
    except KeyboardInterrupt as e:
        if died:  # the watcher said why; the records of the points measured before it are on disk
            return 1
        print("interrupted: agents stopped, namespaces removed", file=sys.stderr)
        return getattr(e, "exit_code", 130)
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass(frozen=True)
class _Plan:
    """What an emulated run builds and starts, all decided (and refused) before any namespace exists."""

    spec: EmuSpec
    fabric: str
    serving: bool  # served inference: its load generator runs on this host
    output_root: str | None  # --jobs: where the jobs' summary goes
    loud: noise.NoiseSpec | None
    noise_dir: Path
    run_id: str
    faults: tuple = ()  # workloads/fabric/faults.py: applied mid-run, restored on the way out


def _plan(args, conf_dir: str) -> _Plan:
    """Check the entry and the options, compose the fabric, and complete `args.overrides` so the
    record describes the topology that will be built."""
    serving = _check_entry(args)
    if args.jobs != 1 and serving:
        raise UsageError(f"--jobs {args.jobs} runs concurrent training, collectives or link jobs; served inference "
                         "runs one server: drop --jobs")
    spec, fabric = spec_from_overrides(conf_dir, args.overrides, nodes=args.nodes, rate=args.rate,
                                       nproc_per_node=args.nproc_per_node,
                                       jobs=args.jobs, check_served=check_emulated)
    output_root = None
    if args.jobs != 1:
        from workloads.core.config import compose
        from workloads.fabric.jobs import split

        split(spec.nodes, args.jobs)
        plain = [o for o in args.overrides if o not in ("-m", "--multirun")]
        output_root = str(compose(conf_dir, plain).output_root)
    args.overrides += _as_built(args, spec)
    loud, noise_dir, run_id = noise.from_overrides(conf_dir, args.overrides)
    if loud is not None:
        loud.require(spec.nodes)
        if args.jobs != 1:
            raise UsageError("fabric.emulate.noise runs beside one job; with --jobs each job is the others' "
                             "noise: drop the noise block or --jobs")
    schedule = faults_of(conf_dir, args.overrides)
    if schedule:
        if serving or args.jobs != 1:
            raise UsageError("emulate.faults applies to one training, collectives or link job; drop it for served "
                             "inference and --jobs")
        faults.check(schedule, spec, args.timeout)
    return _Plan(spec, fabric, serving, output_root, loud, noise_dir, run_id, schedule)


def _as_built(args, spec: EmuSpec) -> list[str]:
    """The overrides that make the record's fabric the one built."""
    out = []
    if args.rate is not None:
        # The record must not claim a shaping the link did not have: the rate goes into
        # the config, and the fabric gets a name of its own unless the user gave one.
        out.append(f"fabric.emulate.rate={'null' if spec.rate is None else spec.rate}")
        if not any(o.startswith("fabric.name=") for o in args.overrides):
            out.append(f"fabric.name=emu-{'veth' if spec.rate is None else spec.rate}")
    # Likewise the topology the record describes is the one built: --nodes, and a leaf-spine's
    # defaults that the profile did not spell out.
    if args.nodes is not None:
        out.append(f"++fabric.emulate.nodes={spec.nodes}")
    if spec.leaf_spine:
        out += [f"++fabric.emulate.{k}={'null' if v is None else v}" for k, v in
                (("leaves", spec.leaves), ("spines", spec.spines), ("hash", spec.hash),
                 ("uplink_rate", spec.uplink_rate))]
    return out


def _run_planned(args, plan: _Plan, died: list[str]) -> int:
    """Build (or borrow) the topology, start the noise, run the entry's agents in it."""
    spec = plan.spec
    # a study's arm may lend its topology (fabric/kept.py): this run's processes are still its own
    with attach(spec, plan.serving) or Topology(spec, host_link=plan.serving) as topo, _watch_delay_line(topo, died):
        print(f"emulate: {topo.describe()}", flush=True)
        addrs = [spec.addr(i) for i in range(spec.nodes)]
        schedule = faults.Injector(spec, plan.faults, topo.tag, plan.noise_dir.parent / "faults")
        with noise.running(plan.loud, topo.nodes, addrs, plan.noise_dir, args.timeout) as noise_env, schedule:
            extra = {**noise_env, **schedule.env()}
            env = {**os.environ, **extra, "FABRICBENCH_RUN_ID": plan.run_id} if extra else None
            if plan.faults:
                print("emulate: faults " + "; ".join(f.describe() for f in plan.faults), flush=True)
                code = run_agents(topo, args.nproc_per_node, args.entry, args.overrides, args.timeout, env=env)
                return _after_faults(schedule, code)
            if plan.serving:
                return run_load_generator(topo, args.entry, args.overrides, args.timeout, env=env)
            if args.jobs != 1:
                return run_jobs(topo, args.jobs, args.nproc_per_node, args.entry, args.overrides, args.timeout,
                                plan.output_root, plan.fabric)
            return run_agents(topo, args.nproc_per_node, args.entry, args.overrides, args.timeout, env=env)


def _after_faults(schedule, code: int) -> int:
    """A fault the run did not see whole (it ended first) is bad input: one line, exit 2, the
    records kept; else the agents' own code."""
    schedule.__exit__(None, None, None)  # restored (and events written) before the verdict is read
    short = schedule.outlasted()
    if short and code == 0:
        print(f"error: the fault schedule outlasted the run ({short[0]}); give an earlier or shorter fault, or a "
              "longer run (train.steps, collectives.iters); its records are kept", file=sys.stderr, flush=True)
        return 2
    return code


@contextlib.contextmanager
def _watch_delay_line(topo: Topology, died: list[str], every_s: float = 0.25):
    """Stop the run as soon as the delay line dies: its links then carry nothing, and the ranks
    would wait for their collectives until the process group's timeout. The run is stopped as
    Ctrl-C stops it (each point in flight records itself as interrupted), after one line."""
    if topo.delay_line is None:
        yield
        return
    import _thread

    done = threading.Event()

    def watch():
        while not done.wait(every_s):
            if (why := topo.delay_line_problem()) is not None:
                died.append(why)
                print(f"error: {why}; stopping the run (namespaces removed, records of finished points kept)",
                      file=sys.stderr, flush=True)
                _thread.interrupt_main()
                return

    t = threading.Thread(target=watch, name="delay-line-watch", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(5)


def _check_entry(args) -> bool:
    """UsageError for an entry point that cannot run across the namespaces; True for served
    inference (its load generator runs here, its server's ranks there)."""
    crossing = catalog.scripts(crosses_link=True)
    use = f"use {', '.join(crossing[:-1])} or {crossing[-1]}" if len(crossing) > 1 else f"use {crossing[0]}"
    if not Path(args.entry).is_file():
        raise UsageError(f"entry point {args.entry} does not exist; {use}")
    runs = catalog.for_script(args.entry)
    if not runs or not all(w.crosses_link for w in runs):
        raise UsageError(f"{args.entry} does not run across emulated nodes; {use}")
    if args.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node={args.nproc_per_node}; use 1 or more")
    refuse_other_workloads(args.entry, args.overrides)  # as the entry point would, before any namespace
    if len(runs) == 1 and runs[0].overrides and not catalog.chooses_workload(args.overrides):
        from workloads.core.config import add_override

        # as that entry point does itself, and in the same place: beside the other overrides,
        # never before a -m (Hydra would then take the rest as unrecognized arguments)
        argv = [args.entry, *args.overrides]
        for o in runs[0].overrides:
            add_override(argv, o)
        args.overrides = argv[1:]
    return any(w.served for w in runs)


def run_load_generator(topo: Topology, entry: str, overrides: Sequence[str], timeout_s: float,
                       python: str = sys.executable, env: Mapping[str, str] | None = None) -> int:
    """Served inference: the load generator runs in this host's namespace and starts the
    server through the reference adapter, which finds the namespaces in NODES_ENV and runs
    one torchrun agent per node there (serve_agents). Rank 0 answers HTTP on node 0's end of
    the unshaped host link; the TP all_reduces cross the shaped emu0 link."""
    argv = [python, entry, *overrides, f"server.host={topo.host_addr}", f"server.nnodes={topo.spec.nodes}",
            f"server.dist_init_addr={topo.spec.addr(0)}:{MASTER_PORT}"]
    env = dict(os.environ if env is None else env) | topo.env() | {NODES_ENV: ",".join(topo.nodes)}
    p = _fork_load_generator(argv, env) or subprocess.Popen(argv, env=env)
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"error: emulated run exceeded {timeout_s:g}s; stopping the load generator and its server",
              file=sys.stderr)
        return 124
    finally:
        if p.poll() is None:  # it stops its own server on SIGTERM (workloads/inference/run.py)
            p.terminate()
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _fork_load_generator(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen | None:
    """The load generator forked from this emulator when a study forked it warm (torch and the
    ranks' imports loaded: workloads/study/fabrics.py), instead of a fresh interpreter importing
    torch again (the inference entry does, ~4-9 s of CPU on a busy 2-core host). It runs in a
    session of its own, so it dies with this process (and stops its server) rather than with
    our process group. None: exec it."""
    if argv[0] != sys.executable or "torch" not in sys.modules or forkrank.mode() != "fork" or not forkrank.can_fork():
        return None
    from workloads.core import celllock
    from workloads.inference.adapters import forkstart

    def prepare() -> None:
        celllock.die_with_parent()
        forkstart.prefork()  # the reference engine's watchdog-to-be, a copy of this warm state (forkstart.py)

    return forkrank.script(argv[1], argv[2:], dict(env), "fb-loadgen", prepare=prepare)


def serve_agents(nproc: int, entry: str, overrides: Sequence[str]) -> int:
    """`python -m workloads.commands.emulate --serve <nproc> <entry> <overrides>`: one torchrun
    agent per namespace named in NODES_ENV (the reference engine), for as long as it serves."""
    nodes = emulated_nodes() or []
    spec = EmuSpec(nodes=max(2, len(nodes)))
    return _serve(nodes, [agent_argv(sys.executable, spec, i, nproc, entry, overrides) for i in range(len(nodes))],
                  [{}] * len(nodes))


def agent_main(torchrun_args: Sequence[str]) -> int:
    """`python -m workloads.commands.emulate --agent <torchrun args>`: torchrun in this namespace."""
    from workloads.commands.entry import torchrun

    return torchrun(list(torchrun_args))


def serve_nodes(per_node_json: str) -> int:
    """`python -m workloads.commands.emulate --serve-nodes '[{"argv": [...], "env": {...}}, ...]'`:
    an engine that starts each node itself (vLLM: node 0's API server, headless workers on the
    others; SGLang: node 0's API server and schedulers, schedulers only on the others), entry i
    in the i-th namespace of NODES_ENV, for as long as the server runs."""
    import json

    per_node = json.loads(per_node_json)
    return _serve(emulated_nodes() or [], [n["argv"] for n in per_node], [n["env"] for n in per_node])


def _serve(nodes: list[str], argvs: list[list[str]], envs: list[dict[str, str]]) -> int:
    """A server's processes, argvs[i] in namespace nodes[i], until one ends or the orchestrator
    stops us with SIGTERM (turned into KeyboardInterrupt: every node's process is stopped)."""
    if len(nodes) < 2 or len(nodes) != len(argvs):
        print(f"error: {len(argvs)} node command(s) for the {len(nodes)} emulated nodes in {NODES_ENV}; run "
              "through launch/emulate.py", file=sys.stderr)
        return 2
    base = _node_env(os.environ, nodes[0].removeprefix(PREFIX).rsplit("-", 1)[0])
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        return run_in_nodes(nodes, argvs, [base | env for env in envs], float("inf"))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    from workloads.commands.entry import end  # torchrun's agent ran here: no interpreter teardown

    if sys.argv[1:2] == ["--agent"]:
        end(agent_main(sys.argv[2:]))
    if sys.argv[1:2] == ["--serve"]:
        end(serve_agents(int(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    if sys.argv[1:2] == ["--serve-nodes"]:
        sys.exit(serve_nodes(sys.argv[2]))
    sys.exit(main())
