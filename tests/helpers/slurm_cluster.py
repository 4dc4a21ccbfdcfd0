"""A real, private, one-machine Slurm cluster for tests.

Installs nothing: it needs Debian's `slurm-wlm` and `munge` (CI installs them) and root.
It writes its own slurm.conf into a temp dir (free ports, state and spool in that dir,
SlurmUser=root), starts its own munged (own key and socket), slurmctld and one slurmd per
node (`slurmd -N <name>`: Debian's build lets several share one machine, each on its own
port), waits until every node is idle, and stops every daemon it started afterwards, also
when a test fails. Commands run against it get `SLURM_CONF` from `cluster.env()`.

    with SlurmCluster(tmp_path, nodes=2) as c:
        subprocess.run(["sbatch", "--wait", ...], env=c.env())
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing_reason() -> str | None:
    """Why this machine cannot run the cluster, or None when it can (a pytest skip reason)."""
    if os.geteuid() != 0:
        return "needs root (munged, slurmctld and slurmd run as root here)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    missing += [c for c in ("sbatch", "srun", "sinfo", "scontrol", "squeue") if shutil.which(c) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing); "
                "install Debian's slurm-wlm and munge (`apt-get install slurm-wlm munge`, as .ci/run does)")
    return None


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmCluster:
    def __init__(self, root: str | os.PathLike, nodes: int = 2, cpus: int = 4, name: str | None = None):
        self.root = Path(root) / "slurm"
        self.node_names = [f"n{i + 1}" for i in range(nodes)]
        self.cpus = cpus
        # Cluster names are lower-case alphanumerics; the pid keeps parallel sessions apart.
        self.name = name or f"fb{os.getpid()}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.sock"

    # --- configuration -------------------------------------------------------------
    def _write_conf(self) -> None:
        r = self.root
        # slurmd makes one Unix socket per job step under its spool directory (<spool>/<node>/
        # <node>_<job>.<step>, the batch step 4294967291); past 108 bytes with its NUL it cannot
        # launch the job, and Slurm requeues it for ever: `sbatch --wait` would hang, not fail
        longest = len(str(r / "spool" / self.node_names[-1] / f"{self.node_names[-1]}_99.4294967291"))
        if longest > 107:
            raise ValueError(f"SlurmCluster root {r} is too long for slurmd's step sockets ({longest} > 107 bytes); "
                             "use a shorter one (tmp_path_factory.mktemp('s'))")
        for d in ("state", "spool", "log", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "munge").chmod(0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        host = socket.gethostname().split(".")[0]
        ctld_port, *node_ports = free_ports(1 + len(self.node_names))
        self.ctld_port = ctld_port
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={node_ports[0]}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            # Documented as the setup for several slurmd on one host without cgroups.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SlurmdParameters=config_overrides",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MailProg=/bin/true",
            "KillWait=5",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
        ]
        for node, port in zip(self.node_names, node_ports):
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} RealMemory=1000 State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=30 State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def env(self, base: dict | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        # Inherited job variables would make sbatch/srun think they run inside a job.
        for k in [k for k in env if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_PROCID", "SBATCH_", "SRUN_"))]:
            del env[k]
        return env

    # --- lifecycle -----------------------------------------------------------------
    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{key}.out", "wb")
        # Own session: stop() can signal the daemon and anything it forked.
        self.procs[key] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env(),
                                           start_new_session=True)

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        reason = missing_reason()
        if reason:
            raise RuntimeError(reason)
        self._write_conf()
        m = self.root / "munge"
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), 15, "munged socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._run(["scontrol", "ping"]).returncode == 0, timeout_s, "slurmctld")
        for node in self.node_names:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        self._wait(self._all_idle, timeout_s, "all nodes idle")
        return self

    def _run(self, argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout)

    def _all_idle(self) -> bool:
        p = self._run(["sinfo", "-h", "-N", "-o", "%N %t"])
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return p.returncode == 0 and all(states.get(n) == "idle" for n in self.node_names)

    def _wait(self, ok, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs()}")
            try:
                if ok():
                    return
            except (subprocess.TimeoutExpired, OSError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}:\n{self.logs()}")

    def logs(self, tail: int = 30) -> str:
        out = []
        for p in sorted((self.root / "log").glob("*")) + [self.root / "munge" / "munged.log"]:
            if p.is_file():
                lines = p.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {p.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel our jobs, then stop slurmd, slurmctld and munged (that order: the
        daemons talk to munged while shutting down). Idempotent."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            try:
                self._run(["scancel", "--full", "--quiet", "--partition=debug"], timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        order = [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for key in order:
            p = self.procs.get(key)
            if p is None:
                continue
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
            # Job steps live in their own sessions (slurmstepd); none may outlive the test.
            self._kill_ours()
        self.procs.clear()

    def _kill_ours(self) -> None:
        """Anything still running with our SLURM_CONF (slurmstepd and job tasks)."""
        conf = str(self.conf).encode()
        for pid in our_leftover_pids(conf):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self) -> SlurmCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def our_leftover_pids(conf: bytes) -> list[int]:
    """Processes whose command line or environment names this cluster's slurm.conf."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if conf in (d / "cmdline").read_bytes() or conf in (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids
