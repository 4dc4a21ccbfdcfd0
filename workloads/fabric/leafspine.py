"""An emulated leaf-spine fabric: hosts, leaf routers and spine routers as network namespaces,
ECMP between the tiers, and each spine's byte counter readable by the ranks.

    emulate: {nodes: 4, topology: leaf-spine, leaves: 2, spines: 2, rate: 100mbit, uplink_rate: 100mbit, hash: l4}

Hosts (fb-<tag>-<i>) sit `nodes / leaves` to a leaf. Each host's `emu0` is on its leaf's /24
(10.77.<leaf>.0/24, the leaf's bridge answering at .254), shaped at `rate` both ways (the host's
egress and the leaf port's). Every leaf (fb-<tag>-l<j>) has one uplink `u<k>` to every spine
(fb-<tag>-s<k>; the spine's end is `d<j>`), shaped at `uplink_rate` both ways, on a /30 of
10.79.<leaf>.0/24. A leaf reaches another leaf's /24 by one multipath route over all its
uplinks: the kernel's ECMP, hashing each flow on its addresses (`hash: l3`,
fib_multipath_hash_policy 0) or on addresses and ports (`hash: l4`, policy 1), as a switch
hashes on its header fields. So a few large flows can land on one spine while the other idles,
as on a real fabric; with l3 every flow between one pair of hosts takes the same spine.

Why a leaf's hosts share a bridge rather than one routed port each: the hosts of one leaf then
talk at `rate` without crossing a spine, as a ToR switch's ports do.

Per-spine bytes: the emulator keeps one idle process in each spine's namespace and passes
their pids (PATHS_ENV); /proc/<pid>/net/dev is that namespace's interface table, so a rank
reads what each spine forwarded with one file read per spine (`read_paths`), no subprocess.
A spine's transmitted bytes are the bytes it carried (each enters on one downlink and leaves
on another), headers included.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Mapping

PATHS_ENV = "FABRICBENCH_EMULATED_PATHS"   # "s0=<pid>,s1=<pid>": an idle process in each spine
HASH_POLICY = {"l3": 0, "l4": 1}             # net.ipv4.fib_multipath_hash_policy
LEAF_ADDR = 254                              # the leaf's address on its hosts' /24
UPLINK_NET = "10.79"                         # 10.79.<leaf>.<4k+1|4k+2>/30: leaf j <-> spine k


def host_addr(node: int, hosts_per_leaf: int) -> str:
    return f"10.77.{node // hosts_per_leaf}.{node + 1}"


def _uplink(leaf: int, spine: int) -> tuple[str, str]:
    """(leaf end, spine end) of leaf `leaf`'s uplink to spine `spine`."""
    return f"{UPLINK_NET}.{leaf}.{4 * spine + 1}", f"{UPLINK_NET}.{leaf}.{4 * spine + 2}"


def names(tag: str, leaves: int, spines: int) -> tuple[list[str], list[str]]:
    return [f"fb-{tag}-l{j}" for j in range(leaves)], [f"fb-{tag}-s{k}" for k in range(spines)]


def _sysctl(run: Callable, ns: str, **values) -> None:
    for key, v in values.items():
        run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key.replace('__', '.')}={v}"])


def build(run: Callable, shape: Callable, veth: Callable, spec, hosts: list[str], leaves: list[str],
          spines: list[str]) -> None:
    """Wire the namespaces (already created, lo up): hosts to leaves, leaves to spines, routes.
    `shape(ns, dev, rate)` puts the qdisc on one egress; `veth(ns1, if1, ns2, if2, latency, label)`
    makes one link, through the delay line when `latency` is set."""
    per_leaf = spec.nodes // spec.leaves
    for ns in leaves + spines:
        _sysctl(run, ns, net__ipv4__ip_forward=1, net__ipv4__conf__all__rp_filter=0,
                net__ipv4__conf__default__rp_filter=0)
    for j, leaf in enumerate(leaves):
        _sysctl(run, leaf, net__ipv4__fib_multipath_hash_policy=HASH_POLICY[spec.hash])
        run(["ip", "-n", leaf, "link", "add", "name", "br0", "type", "bridge"])
        run(["ip", "-n", leaf, "addr", "add", f"10.77.{j}.{LEAF_ADDR}/24", "dev", "br0"])
        run(["ip", "-n", leaf, "link", "set", "br0", "up"])
    for i, host in enumerate(hosts):
        j = i // per_leaf
        port = f"h{i}"
        veth(host, "emu0", leaves[j], port, spec.latency, f"n{i}-l{j}")
        run(["ip", "-n", leaves[j], "link", "set", port, "mtu", str(spec.mtu), "master", "br0", "up"])
        run(["ip", "-n", host, "addr", "add", f"{host_addr(i, per_leaf)}/24", "dev", "emu0"])
        run(["ip", "-n", host, "link", "set", "emu0", "up"])
        run(["ip", "-n", host, "route", "add", "default", "via", f"10.77.{j}.{LEAF_ADDR}"])
        shape(host, "emu0", spec.rate)
        shape(leaves[j], port, spec.rate)  # the leaf port's egress is the host's ingress
    for j, leaf in enumerate(leaves):
        for k, spine in enumerate(spines):
            up, down = f"u{k}", f"d{j}"
            veth(leaf, up, spine, down, spec.uplink_latency, f"l{j}-s{k}")
            mine, theirs = _uplink(j, k)
            run(["ip", "-n", leaf, "addr", "add", f"{mine}/30", "dev", up])
            run(["ip", "-n", spine, "addr", "add", f"{theirs}/30", "dev", down])
            run(["ip", "-n", leaf, "link", "set", up, "up"])
            run(["ip", "-n", spine, "link", "set", down, "up"])
            shape(leaf, up, spec.spine_uplink(k))
            shape(spine, down, spec.spine_uplink(k))
            # the spine reaches leaf j's hosts down this link, one path
            run(["ip", "-n", spine, "route", "add", f"10.77.{j}.0/24", "via", mine, "dev", down])
    for j, leaf in enumerate(leaves):
        for other in range(spec.leaves):
            if other == j:
                continue
            hops = []
            for k in range(spec.spines):
                hops += ["nexthop", "via", _uplink(j, k)[1], "dev", f"u{k}", "weight", "1"]
            run(["ip", "-n", leaf, "route", "add", f"10.77.{other}.0/24", *hops])


def start_sentinels(spines: list[str]) -> list[subprocess.Popen]:
    """One idle process per spine namespace, whose /proc/<pid>/net/dev the ranks read."""
    out = []
    for ns in spines:
        out.append(subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "infinity"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return out


def paths_env(sentinels: list[subprocess.Popen]) -> str:
    # `ip netns exec` execs sleep in place, so the Popen's pid is the process inside the namespace
    return ",".join(f"s{k}={p.pid}" for k, p in enumerate(sentinels))


def stop_sentinels(sentinels: list[subprocess.Popen]) -> None:
    for p in sentinels:
        p.kill()
        p.wait(10)


def read_paths(env: Mapping[str, str] | None = None) -> dict[str, int] | None:
    """Bytes each spine has transmitted so far (all its interfaces but lo), or None when this
    run has no emulated spines."""
    spec = (os.environ if env is None else env).get(PATHS_ENV)
    if not spec:
        return None
    from workloads.fabric.nic import parse_proc_net_dev

    out = {}
    for item in spec.split(","):
        label, _, pid = item.partition("=")
        try:
            table = parse_proc_net_dev(Path(f"/proc/{int(pid)}/net/dev").read_text())
        except (OSError, ValueError):
            return None  # the topology is gone: say nothing rather than something wrong
        out[label] = sum(tx for name, (tx, _) in table.items() if name != "net:lo")
    return out


def summarize_paths(before: dict[str, int] | None, after: dict[str, int] | None) -> dict | None:
    """Per spine: the bytes it carried in the window and its share of all spines' bytes; Jain's
    index over the spines (1: an even spread; 1/n: one spine carried everything)."""
    from workloads.fabric.nic import jain_index

    if not before or not after or before.keys() != after.keys():
        return None
    moved = {k: after[k] - before[k] for k in sorted(before)}
    total = sum(moved.values())
    return {
        "per_path_bytes": moved,
        "share": {k: (v / total if total else None) for k, v in moved.items()},
        "jain_index": jain_index(list(moved.values())),
        "scope": "bytes each emulated spine transmitted (ECMP between leaves), headers included",
    }


def path_rows(paths: dict | None) -> list[tuple[str, str]]:
    if not paths:
        return []
    shares = ", ".join(f"{k} {100 * s:.1f}%" if s is not None else f"{k} n/a" for k, s in paths["share"].items())
    j = paths["jain_index"]
    return [("spines", f"{shares}; Jain {'n/a' if j is None else f'{j:.3f}'}")]
