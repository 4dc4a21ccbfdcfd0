"""Fabric preflight: before the process group exists, check that what the profile names is there.

NCCL does not fail when `NCCL_IB_HCA` names a device that is absent, a port that is down
or a GID that is RoCE v1: it quietly falls back (to another GID, to `NET/Socket`) and the
run is just slow. So every rank reads sysfs first and refuses a profile that cannot work:

- every RDMA port selected by `NCCL_IB_HCA` exists, is ACTIVE and has the link layer the
  profile expects (`InfiniBand` for ib, `Ethernet` for roce);
- for RoCE, `NCCL_IB_GID_INDEX` exists on each selected port and is a RoCE v2 GID;
- interfaces named by `NCCL_SOCKET_IFNAME` / `GLOO_SOCKET_IFNAME` exist and are up.

Only sysfs is read (no root needed, nothing changed). The root defaults to `/sys` and can
be moved (`root=` or `FABRICBENCH_SYSFS_ROOT`) so tests and `doctor` can use a fixture tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from workloads.core.errors import UsageError

SYSFS_ENV = "FABRICBENCH_SYSFS_ROOT"
IFF_UP = 0x1  # <linux/if.h>
# sysfs link_layer -> the name NCCL prints after the device (`mlx5_0:1/RoCE`) and profiles use.
LINK_LAYERS = {"InfiniBand": "IB", "Ethernet": "RoCE"}


def sysfs_root(root: str | os.PathLike | None = None) -> Path:
    return Path(root or os.environ.get(SYSFS_ENV) or "/sys")


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:  # absent, or EINVAL (e.g. `speed` of lo, `types/<i>` of an unused GID)
        return None


# ---------------------------------------------------------------------------------------
# NCCL's list syntax (NCCL_IB_HCA, NCCL_SOCKET_IFNAME)


@dataclass(frozen=True)
class NameList:
    """`[^][=]name[:port][,name[:port]...]`: a leading `^` excludes the entries, a following
    `=` makes the names exact, otherwise each entry is a prefix (`mlx5` selects mlx5_0...)."""

    spec: str
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, int | None], ...]

    @classmethod
    def parse(cls, spec: str) -> NameList:
        s = spec.strip()
        exclude = s.startswith("^")
        s = s[1:] if exclude else s
        exact = s.startswith("=")
        s = s[1:] if exact else s
        entries = []
        for item in filter(None, (x.strip() for x in s.split(","))):
            name, _, port = item.partition(":")
            if port and not port.isdigit():
                raise UsageError(f"'{item}' in '{spec}' has port '{port}'; a port is a number (mlx5_0:1)")
            entries.append((name, int(port) if port else None))
        return cls(spec, exclude, exact, tuple(entries))

    def _hit(self, name: str, port: int | None) -> bool:
        for ename, eport in self.entries:
            same = name == ename if self.exact else name.startswith(ename)
            if same and (eport is None or port is None or eport == port):
                return True
        return False

    def matches(self, name: str, port: int | None = None) -> bool:
        return self._hit(name, port) != self.exclude

    def unmatched_entries(self, names: list[tuple[str, int | None]]) -> list[str]:
        """Include-list entries that select nothing (for the error message)."""
        if self.exclude:
            return []
        out = []
        for ename, eport in self.entries:
            one = NameList(self.spec, False, self.exact, ((ename, eport),))
            if not any(one._hit(n, p) for n, p in names):
                out.append(ename + (f":{eport}" if eport is not None else ""))
        return out


# ---------------------------------------------------------------------------------------
# sysfs inventory


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str | None  # "RoCE v2", "IB/RoCE v1", or None on IB ports
    ndev: str | None  # the netdev a RoCE GID belongs to

    @property
    def is_roce_v2(self) -> bool:
        return (self.type or "").strip().lower() == "roce v2"


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED... (sysfs "4: ACTIVE" without the number)
    link_layer: str  # as sysfs says: InfiniBand | Ethernet
    rate: str | None  # "400 Gb/sec (4X NDR)"
    gids: tuple[Gid, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def nccl_link_layer(self) -> str:
        return LINK_LAYERS.get(self.link_layer, self.link_layer)

    def gid(self, index: int) -> Gid | None:
        return next((g for g in self.gids if g.index == index), None)


@dataclass(frozen=True)
class NetIface:
    name: str
    operstate: str  # up, down, unknown (lo reports unknown while up)
    flags: int
    mtu: int | None
    speed_mbps: int | None  # None where the driver has no speed (lo, veth)

    @property
    def up(self) -> bool:
        return bool(self.flags & IFF_UP) and self.operstate not in ("down", "lowerlayerdown", "notpresent")


_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def rdma_ports(root: str | os.PathLike | None = None) -> list[RdmaPort]:
    base = sysfs_root(root) / "class" / "infiniband"
    out = []
    if not base.is_dir():
        return out
    for dev in sorted(base.iterdir()):
        ports = dev / "ports"
        if not ports.is_dir():
            continue
        for p in sorted(ports.iterdir(), key=lambda x: int(x.name) if x.name.isdigit() else 0):
            if not p.name.isdigit():
                continue
            gids = []
            gdir = p / "gids"
            if gdir.is_dir():
                for g in sorted(gdir.iterdir(), key=lambda x: int(x.name) if x.name.isdigit() else -1):
                    value = _read(g)
                    if not g.name.isdigit() or not value or value == _ZERO_GID:
                        continue  # unused table slots read as all zeros
                    i = int(g.name)
                    gids.append(Gid(i, value, _read(p / "gid_attrs" / "types" / g.name),
                                    _read(p / "gid_attrs" / "ndevs" / g.name)))
            state = (_read(p / "state") or "unknown").split(":")[-1].strip()
            out.append(RdmaPort(dev.name, int(p.name), state, _read(p / "link_layer") or "unknown",
                                _read(p / "rate"), tuple(gids)))
    return out


def net_ifaces(root: str | os.PathLike | None = None) -> list[NetIface]:
    base = sysfs_root(root) / "class" / "net"
    out = []
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        if not (d / "operstate").exists():
            continue  # bonding_masters and other plain files
        flags, mtu, speed = _read(d / "flags"), _read(d / "mtu"), _read(d / "speed")
        out.append(NetIface(
            d.name, _read(d / "operstate") or "unknown", int(flags, 16) if flags else 0,
            int(mtu) if mtu and mtu.isdigit() else None,
            int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
        ))
    return out


# ---------------------------------------------------------------------------------------
# the checks


def effective_env(profile_env: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment NCCL/Gloo will see once the profile is applied (a None value unsets)."""
    env = dict(os.environ if environ is None else environ)
    for k, v in profile_env.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _present_ports(ports: list[RdmaPort]) -> str:
    if not ports:
        return "none (no /sys/class/infiniband: this host has no RDMA devices)"
    return ", ".join(f"{p.label} ({p.nccl_link_layer}, {p.state})" for p in ports)


def _present_ifaces(ifaces: list[NetIface]) -> str:
    return ", ".join(f"{i.name} ({'up' if i.up else 'down'})" for i in ifaces) or "none"


def select_ports(spec: str | None, ports: list[RdmaPort]) -> list[RdmaPort]:
    if not spec:
        return list(ports)
    nl = NameList.parse(spec)
    return [p for p in ports if nl.matches(p.device, p.port)]


def check_rdma(profile_name: str, env: Mapping[str, str], expect_link: str | None,
               ports: list[RdmaPort]) -> list[str]:
    """Problems with the RDMA ports the profile selects (empty list: fine)."""
    spec = env.get("NCCL_IB_HCA") or None
    selected = select_ports(spec, ports)
    what = f"NCCL_IB_HCA={spec}" if spec else "NCCL_IB_HCA (unset: every device)"
    if not selected:
        return [f"{what} matched no RDMA device; present: {_present_ports(ports)}"]
    problems = []
    if spec:
        missing = NameList.parse(spec).unmatched_entries([(p.device, p.port) for p in ports])
        if missing:
            problems.append(f"{what}: {', '.join(missing)} matched no RDMA device; present: {_present_ports(ports)}")
    for p in selected:
        if p.state != "ACTIVE":
            problems.append(f"{what} selects {p.label}, whose port state is {p.state} (not ACTIVE); bring the "
                            f"link up or leave it out of NCCL_IB_HCA (e.g. NCCL_IB_HCA=^={p.device})")
        if expect_link and p.nccl_link_layer != expect_link:
            problems.append(f"{what} selects {p.label}, whose link layer is {p.link_layer}; fabric={profile_name} "
                            f"expects {'InfiniBand' if expect_link == 'IB' else 'Ethernet (RoCE)'}")
    if expect_link == "RoCE":
        problems += _check_gid(env, [p for p in selected if p.link_layer == "Ethernet"])
    return problems


def _check_gid(env: Mapping[str, str], ports: list[RdmaPort]) -> list[str]:
    raw = env.get("NCCL_IB_GID_INDEX")
    problems = []
    for p in ports:
        v2 = [g.index for g in p.gids if g.is_roce_v2]
        if raw in (None, "", "-1"):
            # NCCL >= 2.21 picks a GID itself (NCCL_IB_ROCE_VERSION_NUM, default 2); it needs one.
            if not v2:
                problems.append(f"{p.label} has no RoCE v2 GID (GIDs: {_gids(p)}); assign an IP address to "
                                f"{_ndev(p)} or set NCCL_IB_GID_INDEX")
            continue
        try:
            idx = int(raw)
        except ValueError:
            return [f"NCCL_IB_GID_INDEX={raw!r} is not a number"]
        g = p.gid(idx)
        if g is None:
            problems.append(f"NCCL_IB_GID_INDEX={idx} does not exist on {p.label} (GIDs: {_gids(p)}); "
                            f"RoCE v2 GIDs there: {', '.join(map(str, v2)) or 'none'}")
        elif not g.is_roce_v2:
            problems.append(f"NCCL_IB_GID_INDEX={idx} on {p.label} is {g.type or 'of unknown type'}, not RoCE v2; "
                            f"RoCE v2 GIDs there: {', '.join(map(str, v2)) or 'none'}")
    return problems


def _gids(p: RdmaPort) -> str:
    return ", ".join(f"{g.index}={g.type or '?'}" for g in p.gids) or "none"


def _ndev(p: RdmaPort) -> str:
    return next((g.ndev for g in p.gids if g.ndev), "its netdev")


def check_ifaces(var: str, spec: str, ifaces: list[NetIface], nccl_syntax: bool) -> list[str]:
    if nccl_syntax:
        nl = NameList.parse(spec)
    else:
        # Gloo takes plain names (a comma-separated list in torch), no ^ or = prefixes.
        if spec.strip()[:1] in ("^", "="):
            return [f"{var}={spec}: Gloo takes exact interface names, not NCCL's ^/= syntax; "
                    f"name the interface(s), e.g. {var}=eth0"]
        nl = NameList(spec, False, True, tuple((n.strip(), None) for n in spec.split(",") if n.strip()))
    selected = [i for i in ifaces if nl.matches(i.name)]
    present = _present_ifaces(ifaces)
    if not selected:
        return [f"{var}={spec} matched no network interface; present: {present}"]
    problems = []
    missing = nl.unmatched_entries([(i.name, None) for i in ifaces])
    if missing:
        problems.append(f"{var}={spec}: {', '.join(missing)} matched no network interface; present: {present}")
    down = [i.name for i in selected if not i.up]
    if nl.exclude:
        if len(down) == len(selected):
            problems.append(f"{var}={spec} leaves only interfaces that are down ({', '.join(down)}); present: {present}")
    elif down:
        problems.append(f"{var}={spec} selects {', '.join(down)}, which {'is' if len(down) == 1 else 'are'} down; "
                        f"present: {present}")
    return problems


def uses_ib(profile, env: Mapping[str, str]) -> bool:
    """The profile runs NCCL over IB verbs (IB or RoCE)."""
    return (profile.backend == "nccl" and env.get("NCCL_IB_DISABLE", "0") != "1"
            and str((profile.expect or {}).get("network") or "").startswith("IB"))


def check(profile, environ: Mapping[str, str] | None = None, root: str | os.PathLike | None = None) -> list[str]:
    """Every problem with `profile` on this host, as messages (empty: ready). Pure reads."""
    env = effective_env(profile.env, environ)
    expect = profile.expect or {}
    problems: list[str] = []
    if uses_ib(profile, env):
        problems += check_rdma(profile.name, env, expect.get("link_layer"), rdma_ports(root))
    ifaces = None
    if profile.backend == "nccl" and env.get("NCCL_SOCKET_IFNAME"):
        ifaces = net_ifaces(root)
        problems += check_ifaces("NCCL_SOCKET_IFNAME", env["NCCL_SOCKET_IFNAME"], ifaces, nccl_syntax=True)
    if env.get("GLOO_SOCKET_IFNAME"):
        ifaces = ifaces if ifaces is not None else net_ifaces(root)
        problems += check_ifaces("GLOO_SOCKET_IFNAME", env["GLOO_SOCKET_IFNAME"], ifaces, nccl_syntax=False)
    return problems


# NCCL's IB transport pins (registers) its buffers; container runtimes default to a few MiB.
MEMLOCK_MIN = 1 << 30


def memlock_warning(soft_limit: int, uses_ib: bool) -> str | None:
    """The locked-memory limit as a warning (not an error: with dma-buf registration some
    setups work below it); `soft_limit` is RLIMIT_MEMLOCK's soft value in bytes."""
    import resource

    if not uses_ib or soft_limit == resource.RLIM_INFINITY or soft_limit >= MEMLOCK_MIN:
        return None
    return (f"locked-memory limit is {soft_limit // 1024} KiB (ulimit -l); NCCL over IB/RoCE registers its "
            "buffers and may fail or fall back: run with ulimit -l unlimited (docker: --ulimit memlock=-1 "
            "--cap-add=IPC_LOCK --device=/dev/infiniband)")


def preflight(profile, environ: Mapping[str, str] | None = None, root: str | os.PathLike | None = None) -> None:
    """Raise one UsageError listing every problem; return quietly when the host is ready."""
    import resource

    ib = uses_ib(profile, effective_env(profile.env, environ))
    if (why := memlock_warning(resource.getrlimit(resource.RLIMIT_MEMLOCK)[0], ib)):
        print(f"warning: fabric={profile.name}: {why}", flush=True)
    problems = check(profile, environ, root)
    if problems:
        head = f"fabric={profile.name} cannot run on this host (preflight, {sysfs_root(root)}):"
        fix = ("  This is an emulated fabric: run it through launch/emulate.py (as root), which builds its links."
               if getattr(profile, "emulate", None) else
               "  Fix the profile's env (conf/fabric/ or conf/local/default.yaml) or the host.")
        raise UsageError("\n".join([head, *(f"  - {p}" for p in problems), fix]))
