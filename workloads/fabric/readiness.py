"""Container readiness: the settings of *this process* that make NCCL or UCX quietly leave the
fabric a profile names, read from inside the container (or on any host) before a rank starts.

sysfs is not namespaced, so preflight's HCA check passes inside a container that has no RDMA
at all; what a container changes is the process itself:

- the verbs device nodes (`/dev/infiniband/uverbsN`) of the HCAs `NCCL_IB_HCA` selects: without
  `--device=/dev/infiniband` NCCL finds no IB device and uses NET/Socket, silently;
- pinning: registered (pinned) memory is bounded by RLIMIT_MEMLOCK unless the process holds
  CAP_IPC_LOCK *in the initial user namespace*: ib_umem_get (torvalds/linux
  drivers/infiniband/core/umem.c) refuses with -ENOMEM when `new_pinned > lock_limit &&
  !capable(CAP_IPC_LOCK)`, mm/mlock.c's can_do_mlock and mlock(2) ask the same, and capable()
  is `ns_capable(&init_user_ns, cap)` (kernel/capability.c). So in a user namespace (rootless
  podman/docker, enroot/pyxis, Slurm's rootless OCI runtime, docker's userns-remap: any
  /proc/self/uid_map other than the identity `0 0 4294967295`) a CAP_IPC_LOCK in CapEff is the
  namespace's and lifts nothing; only the limit counts. A non-root user holds no effective
  capability after exec unless it is ambient (docker and Kubernetes set none), which CapEff
  shows. A runtime's default limit is a few MiB, so `ibv_reg_mr` fails with ENOMEM (UCX then
  drops its RDMA transports for tcp);
- `/dev/shm` size: NCCL's SHM transport between a node's ranks puts its buffers there, and a
  runtime's default is 64 MiB;
- the libraries NCCL dlopens for the network: `libibverbs.so.1`, and the net plugin
  `NCCL_NET_PLUGIN` names. A dlopen failure is an INFO line and NET/Socket.

Every problem is one line: which setting, what NCCL/UCX then does, and the flag that fixes it.
Pure reads (`/proc/self/status`, getrlimit, statvfs, dlopen), no root needed.
"""

from __future__ import annotations

import ctypes
import os
import resource
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from workloads.fabric import preflight

CAP_IPC_LOCK = 14  # <linux/capability.h>
IDENTITY_MAP = "0 0 4294967295"  # the initial user namespace's uid_map (user_namespaces(7))
# Pinning below this without CAP_IPC_LOCK is a problem (preflight's memlock warning threshold:
# NCCL registers a few hundred MiB of buffers per rank on a multi-NIC node).
PIN_MIN = preflight.MEMLOCK_MIN
# NCCL's SHM transport: per pair of local ranks, buffers per channel (NCCL_BUFFSIZE, 4 MiB) in
# both directions; Docker's 64 MiB default fails on one 8-GPU node. The docs' runs use 16g.
SHM_MIN = 1 << 30
IBVERBS = "libibverbs.so.1"


@dataclass(frozen=True)
class Effective:
    """What this process can do, as the kernel sees it."""

    cap_eff: int                # CapEff from /proc/self/status (a bit mask)
    memlock: int                # RLIMIT_MEMLOCK soft limit, bytes, or resource.RLIM_INFINITY
    shm_bytes: int | None       # size of the filesystem at /dev/shm; None when there is none
    uid_map: str = IDENTITY_MAP  # /proc/self/uid_map: the user namespace's mapping
    euid: int = 0
    memlock_hard: int = resource.RLIM_INFINITY

    @property
    def ipc_lock(self) -> bool:
        return bool(self.cap_eff >> CAP_IPC_LOCK & 1)

    @property
    def initial_userns(self) -> bool:
        """The initial user namespace maps every id to itself, in one line."""
        return [line.split() for line in self.uid_map.strip().splitlines()] == [IDENTITY_MAP.split()]

    @property
    def pins_past_limit(self) -> bool:
        """Whether the kernel lets this process pin past RLIMIT_MEMLOCK (capable(CAP_IPC_LOCK))."""
        return self.ipc_lock and self.initial_userns


def read_effective(proc_status: str | os.PathLike = "/proc/self/status",
                   shm: str | os.PathLike = "/dev/shm", uid_map: str | os.PathLike = "/proc/self/uid_map") -> Effective:
    cap = 0
    for line in Path(proc_status).read_text().splitlines():
        if line.startswith("CapEff:"):
            cap = int(line.split()[1], 16)
    try:
        st = os.statvfs(shm)
        shm_bytes = st.f_blocks * st.f_frsize
    except OSError:
        shm_bytes = None
    try:
        mapping = Path(uid_map).read_text()
    except OSError:
        mapping = IDENTITY_MAP  # a kernel without user namespaces has only the initial one
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return Effective(cap, soft, shm_bytes, mapping, os.geteuid(), hard)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0 or unit == "KiB":
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def uverbs_devices(root: str | os.PathLike | None = None) -> dict[str, str]:
    """HCA name -> its verbs character device (`uverbs0`), from sysfs
    (`class/infiniband_verbs/uverbsN/ibdev` names the HCA; libibverbs matches them the same way)."""
    base = preflight.sysfs_root(root) / "class" / "infiniband_verbs"
    out = {}
    if base.is_dir():
        for d in sorted(base.iterdir()):
            ibdev = preflight._read(d / "ibdev")
            if d.name.startswith("uverbs") and ibdev:
                out[ibdev] = d.name
    return out


def check_devices(env: Mapping[str, str], ports: list[preflight.RdmaPort], uverbs: Mapping[str, str],
                  dev_root: str | os.PathLike = "/dev") -> list[str]:
    spec = env.get("NCCL_IB_HCA") or None
    devices = sorted({p.device for p in preflight.select_ports(spec, ports)})
    if not devices:
        return []  # preflight says the HCA is missing; nothing to look for in /dev
    what = f"NCCL_IB_HCA={spec}" if spec else "NCCL_IB_HCA (unset: every device)"
    missing = []
    for dev in devices:
        node = Path(dev_root) / "infiniband" / uverbs.get(dev, "uverbs*")
        nodes = [node] if "*" not in node.name else sorted(node.parent.glob(node.name))
        if not any(_is_char_device(n) for n in nodes):
            missing.append(f"{dev} ({node})")
    if not missing:
        return []
    # NCCL opens every verbs device it can; with none it is NET/Socket, with some, fewer NICs.
    then = ("NCCL finds no IB device and silently uses NET/Socket" if len(missing) == len(devices) else
            "NCCL silently runs on the other HCAs only (less bandwidth than the profile's)")
    return [f"{what} selects {', '.join(missing)}, whose verbs device is not in this container: {then}; "
            "fix: --device=/dev/infiniband (Kubernetes: request the RDMA device plugin's resource, e.g. "
            "rdma/rdma_shared_device_a)"]


def _is_char_device(p: Path) -> bool:
    try:
        return stat.S_ISCHR(p.stat().st_mode)
    except OSError:
        return False


_SLURM_MEMLOCK = "Slurm: PropagateResourceLimitsExcept=MEMLOCK in slurm.conf and slurmd with LimitMEMLOCK=infinity"


def check_pinning(eff: Effective, what: str) -> list[str]:
    if eff.pins_past_limit or eff.memlock == resource.RLIM_INFINITY or eff.memlock >= PIN_MIN:
        return []
    head = f"{what} registers (pins) its buffers, and this process may pin only {_size(eff.memlock)}"
    tail = "beyond it ibv_reg_mr fails with ENOMEM (NCCL aborts, UCX drops to tcp)"
    hard = ("" if eff.memlock_hard == resource.RLIM_INFINITY or eff.memlock_hard >= PIN_MIN else
            f" (its hard limit is {_size(eff.memlock_hard)} too, so it cannot raise it itself)")
    if not eff.initial_userns:
        mapping = " / ".join(" ".join(line.split()) for line in eff.uid_map.strip().splitlines())
        held = "held here, " if eff.ipc_lock else ""
        return [f"{head}{hard}: it runs in a user namespace (uid_map {mapping}), where CAP_IPC_LOCK ({held}the "
                "namespace's) does not lift RLIMIT_MEMLOCK, since the kernel asks capable(CAP_IPC_LOCK) of the "
                f"initial namespace; {tail}; fix: raise the limit the container starts with: rootless "
                "podman/docker --ulimit memlock=-1 (at most the starting user's hard limit, ulimit -Hl; raise it "
                "in /etc/security/limits.conf), enroot/pyxis and srun --container inherit the job's: "
                f"{_SLURM_MEMLOCK}"]
    if eff.euid != 0:
        return [f"{head}{hard}: it runs as uid {eff.euid} without CAP_IPC_LOCK (a capability added for a "
                f"non-root user is not effective after exec unless it is ambient); {tail}; fix: --ulimit "
                "memlock=-1 where the host's hard limit allows it (ulimit -Hl), or run as root with "
                f"--cap-add=IPC_LOCK ({_SLURM_MEMLOCK})"]
    return [f"{head}{hard}: RLIMIT_MEMLOCK is that and CAP_IPC_LOCK, which lifts it, is not held; {tail}; "
            "fix: --cap-add=IPC_LOCK, or --ulimit memlock=-1 where the host's hard limit allows it (ulimit -Hl; "
            "above it runc fails with \"error setting rlimit type 8\") "
            f"({_SLURM_MEMLOCK})"]


def check_shm(eff: Effective) -> list[str]:
    if eff.shm_bytes is None:
        return ["/dev/shm is missing: NCCL's SHM transport between this node's ranks cannot create its "
                "segments; fix: --ipc=host or --shm-size=16g (Kubernetes: an emptyDir with medium: Memory "
                "mounted at /dev/shm)"]
    if eff.shm_bytes >= SHM_MIN:
        return []
    return [f"/dev/shm is {_size(eff.shm_bytes)}: NCCL's SHM transport between this node's ranks puts its "
            "buffers there and fails when it fills (ncclShmOpen, or SIGBUS), and NCCL_SHM_DISABLE=1 would send "
            "local traffic over the network instead; fix: --ipc=host or --shm-size=16g (Kubernetes: an "
            "emptyDir with medium: Memory mounted at /dev/shm)"]


def _dlopen(name: str) -> str | None:
    """None when `name` loads as NCCL would load it (dlopen), else why not."""
    try:
        ctypes.CDLL(name, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as e:
        return str(e)
    return None


def plugin_library(value: str) -> str:
    """The file NCCL dlopens for NCCL_NET_PLUGIN: a name with `.so` as given, else
    `libnccl-net-<value>.so` (NCCL's net plugin loader)."""
    return value if ".so" in value else f"libnccl-net-{value}.so"


def check_libraries(env: Mapping[str, str], ib: bool, load: Callable[[str], str | None] = _dlopen) -> list[str]:
    problems = []
    if ib and (why := load(IBVERBS)):
        problems.append(f"{IBVERBS} does not load ({why}): NCCL's IB transport dlopens it and, without it, "
                        "silently uses NET/Socket; fix: install rdma-core and ibverbs-providers in the image "
                        "(the project's GPU images have them)")
    plugin = (env.get("NCCL_NET_PLUGIN") or "").strip()
    if plugin and plugin.lower() != "none":
        lib = plugin_library(plugin)
        if (why := load(lib)):
            problems.append(f"NCCL_NET_PLUGIN={plugin}: {lib} does not load ({why}): NCCL falls back to its "
                            "internal IB/Socket transports; fix: put the plugin in the image and on "
                            "LD_LIBRARY_PATH, or unset NCCL_NET_PLUGIN")
    return problems


def check(profile, environ: Mapping[str, str] | None = None, root: str | os.PathLike | None = None,
          dev_root: str | os.PathLike = "/dev", eff: Effective | None = None) -> list[str]:
    """Every container setting of this process that `profile` would silently lose its fabric to
    (empty: ready). Only what the profile uses is checked: a Gloo/TCP profile needs none of it."""
    env = preflight.effective_env(profile.env, environ)
    eff = eff or read_effective()
    ib = preflight.uses_ib(profile, env)
    problems: list[str] = []
    if ib:
        problems += check_devices(env, preflight.rdma_ports(root), uverbs_devices(root), dev_root)
        problems += check_pinning(eff, f"fabric={profile.name} (NCCL over IB verbs)")
    if profile.backend == "nccl":
        problems += check_shm(eff)
        problems += check_libraries(env, ib)
    return problems
