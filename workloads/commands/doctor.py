"""Fabric inventory of this machine, and a fabric profile checked against it.

    fabricbench doctor                       # RDMA ports, GIDs, interfaces, GPUs, NCCL
    fabricbench doctor fabric=roce           # ... and is this host ready for fabric=roce?
    fabricbench doctor fabric=roce fabric.env.NCCL_IB_HCA==mlx5_0 --json
    fabricbench doctor --container fabric=roce   # ... and this process's container settings too

    fabricbench doctor --spec launch/slurm/train.sbatch --spec pod.yaml fabric=roce   # run specs, statically
    fabricbench doctor --compare node1.json node2.json   # what differs between nodes (each: doctor --json)

With a fabric=..., doctor also prints the site settings this node suggests for it, ready to paste
into conf/local/<fabric>.yaml: the active ports of the expected link layer, the RoCE v2 GID index
they share, the default route's interface for the bootstrap, each HCA's NUMA node and the RoCE
congestion counters (workloads/fabric/sitefix.py).

`--container` (run it inside the container, e.g. as the job's first srun step) adds what a
container changes and sysfs does not show: the verbs devices of the selected HCAs, pinning
(RLIMIT_MEMLOCK / CAP_IPC_LOCK), the /dev/shm size and the libraries NCCL dlopens; each is a
setting under which NCCL or UCX would quietly leave the fabric (workloads/fabric/readiness.py).
`--spec` reads the flags users write instead (docker/podman run lines in scripts and docs, pyxis
`srun --container-image`, Kubernetes pod specs, an OCI bundle's config.json for `srun --container`) and names the same settings before a job is
submitted (workloads/fabric/runspec.py); it looks at nothing on this host.

Read-only: sysfs, `nvidia-smi`/`rocm-smi` where installed, torch's NCCL version. It never
needs root and changes nothing. Exit status 1 when the checked profile has problems.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import asdict
from typing import Any

from workloads.core.errors import UsageError
from workloads.fabric import preflight, sitefix


def add_arguments(p) -> None:
    p.add_argument("overrides", nargs="*", help="Hydra overrides choosing the profile to check, e.g. fabric=roce")
    p.add_argument("--json", action="store_true", help="print the inventory and check as JSON")
    p.add_argument("--sysfs-root", default=None, help="read this tree instead of /sys (a fixture, a copy)")
    p.add_argument("--container", action="store_true",
                   help="also check this process's container settings: RDMA device nodes, CAP_IPC_LOCK and "
                        "memlock, /dev/shm size, the libraries NCCL loads (needs a fabric=...)")
    p.add_argument("--dev-root", default="/dev", help="look for /dev/infiniband under this folder instead")
    p.add_argument("--proc-root", default="/proc", help="read the routing table (net/route) under this folder")
    p.add_argument("--compare", nargs="+", metavar="JSON",
                   help="diff the `doctor --json` output of several nodes (firmware, ports and rates, RoCE v2 GIDs, "
                        "NCCL version); exit 1 when they differ")
    p.add_argument("--spec", action="append", default=[], metavar="FILE",
                   help="check this run spec (a script, batch file, Markdown, Kubernetes YAML or an OCI bundle's "
                        "config.json) for the container settings the profile needs, instead of this host "
                        "(repeatable; needs a fabric=...)")


def _run(cmd: list[str]) -> str | None:
    if not shutil.which(cmd[0]):
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpus() -> dict[str, Any]:
    nv = _run(["nvidia-smi", "-L"])
    if nv:
        return {"tool": "nvidia-smi", "devices": nv.splitlines(), "topology": _run(["nvidia-smi", "topo", "-m"])}
    rocm = _run(["rocm-smi", "--showproductname"])
    if rocm:
        return {"tool": "rocm-smi", "devices": [x for x in rocm.splitlines() if x.strip()],
                "topology": _run(["rocm-smi", "--showtopo"])}
    return {"tool": None, "devices": [], "topology": None}


def nccl_version() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"library": None, "version": None}
    lib = "RCCL" if getattr(torch.version, "hip", None) else "NCCL"
    try:
        v = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # torch built without NCCL
        v = None
    return {"library": lib, "version": v, "source": f"torch {torch.__version__} (torch.cuda.nccl.version())"}


def inventory(root=None) -> dict[str, Any]:
    live = preflight.sysfs_root(root).resolve() == preflight.sysfs_root("/sys").resolve()
    addrs: dict[str, list[str]] = {}
    if live:  # addresses are not in sysfs; only the live host has them
        from workloads.fabric.procnet import interface_addresses

        for ip, name in interface_addresses().items():
            addrs.setdefault(name, []).append(ip)
    return {
        "host": socket.gethostname(),
        "sysfs": str(preflight.sysfs_root(root)),
        "rdma": [asdict(p) | {"label": p.label, "nccl_link_layer": p.nccl_link_layer} for p in preflight.rdma_ports(root)],
        "devices": sitefix.device_facts(root),
        "net": [asdict(i) | {"up": i.up, "addresses": sorted(addrs.get(i.name, []))} for i in preflight.net_ifaces(root)],
        "gpus": gpus() if live else {"tool": None, "devices": [], "topology": None, "note": "not the live host"},
        "nccl": nccl_version() if live else {"library": None, "version": None, "source": "not the live host"},
    }


def load_profile(overrides: list[str]):
    from omegaconf import OmegaConf

    from workloads import CONF_DIR
    from workloads.core.config import compose
    from workloads.core.rundir import register_resolvers
    from workloads.fabric.profile import FabricProfile

    register_resolvers()
    cfg = compose(CONF_DIR, overrides)
    return FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))


def check_specs(overrides: list[str], paths: list[str]) -> tuple[str, list[str]]:
    """The profile's name and one line per problem in the run specs `paths`."""
    from workloads.fabric import runspec

    profile = load_profile(overrides)
    env = preflight.effective_env(profile.env)
    needs = runspec.Needs(ib=preflight.uses_ib(profile, env), shm=profile.backend == "nccl")
    problems = []
    for path in paths:
        what = "a script, batch file, Markdown or YAML file, or an OCI bundle's config.json"
        if os.path.isdir(path):
            raise UsageError(f"--spec {path}: a directory, not a file; name {what} in it")
        if not os.path.isfile(path):
            raise UsageError(f"--spec {path}: no such file; name {what}")
        try:
            problems += runspec.lint_file(path, needs)
        except UnicodeDecodeError as e:
            raise UsageError(f"--spec {path}: not a text file (byte {e.object[e.start]:#04x} at offset {e.start} is not "
                             f"UTF-8); name {what}") from None
    return profile.name, problems


def check_profile(overrides: list[str], root=None, container: bool = False, dev_root="/dev") -> dict[str, Any]:
    profile = load_profile(overrides)
    problems = preflight.check(profile, root=root)
    if container:
        from workloads.fabric import readiness

        problems += readiness.check(profile, root=root, dev_root=dev_root)
    if root is None:  # the live host: can its backend run here at all (NCCL needs a GPU)?
        try:
            profile.check_backend_usable()
        except UsageError as e:
            problems.append(str(e))
    env = preflight.effective_env(profile.env)
    shown = {k: env.get(k) for k in profile.env}
    return {"fabric": profile.name, "backend": profile.backend, "env": shown, "expect": profile.expect,
            "container": container, "ready": not problems, "problems": problems}


def suggestion(overrides: list[str], root=None, proc="/proc") -> dict | None:
    """The site settings this node suggests for the profile (workloads/fabric/sitefix.py), as the
    site file's path and text."""
    profile = load_profile(overrides)
    got = sitefix.suggest(profile, root, proc)
    return None if got is None else {"file": f"conf/local/{got.fabric}.yaml", "env": got.env, "text": got.yaml()}


def suggestion_lines(s: dict | None) -> list[str]:
    if not s or not s["env"]:
        return [f"  (no site settings to suggest: {s['text'].splitlines()[-1][2:]})"] if s else []
    return ["", f"Suggested site settings, from this node (paste into {s['file']}):", *s["text"].splitlines()]


def compare_nodes(paths: list[str]) -> int:
    """`--compare a.json b.json ...`: the facts that differ between nodes, one line each."""
    invs = {}
    for path in paths:
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--compare {path}: not the output of `fabricbench doctor --json` ({e}); make one per "
                             "node with srun fabricbench doctor --json > $(hostname).json") from None
        inv = data.get("inventory") if isinstance(data, dict) else None
        if not isinstance(inv, dict):
            raise UsageError(f"--compare {path}: no inventory in it; make it with `fabricbench doctor --json`")
        invs[f"{inv.get('host')} ({os.path.basename(path)})" if inv.get("host") in {
            (i or {}).get("host") for i in invs.values()} else str(inv.get("host"))] = inv
    if len(invs) < 2:
        raise UsageError("--compare needs the JSON of two or more nodes")
    diff = sitefix.compare(invs)
    print(f"Compared {len(invs)} nodes: {', '.join(invs)}")
    print("\n".join(f"  DIFFERS: {line}" for line in diff) if diff else
          "  the same firmware, ports, link rates, RoCE v2 GID indexes and NCCL version on every node")
    return 1 if diff else 0


def render(inv: dict, check: dict | None) -> str:
    out = [f"fabricbench doctor: host {inv['host']} (sysfs {inv['sysfs']})", "", "RDMA ports"]
    if not inv["rdma"]:
        out.append("  none (no /sys/class/infiniband: no RDMA devices on this host)")
    else:
        out.append(f"  {'port':<12} {'state':<8} {'link layer':<12} rate")
        for p in inv["rdma"]:
            out.append(f"  {p['label']:<12} {p['state']:<8} {p['link_layer']:<12} {p['rate'] or '-'}")
            for g in p["gids"]:
                out.append(f"    GID {g['index']:<3} {g['type'] or '-':<11} {g['gid']}  {g['ndev'] or ''}".rstrip())
    out += ["", "Network interfaces", f"  {'name':<14} {'state':<6} {'mtu':>6}  {'speed':>11}  addresses"]
    for i in inv["net"]:
        speed = f"{i['speed_mbps']} Mb/s" if i["speed_mbps"] else "-"
        out.append(f"  {i['name']:<14} {'up' if i['up'] else 'down':<6} {i['mtu'] or '-':>6}  {speed:>11}  "
                   f"{', '.join(i['addresses']) or '-'}")
    g = inv["gpus"]
    out += ["", "GPUs"]
    if g["devices"]:
        out += [f"  {d}" for d in g["devices"]]
        if g.get("topology"):
            out += ["  topology:"] + [f"    {line}" for line in g["topology"].splitlines()]
    else:
        out.append("  none found (no nvidia-smi or rocm-smi answered)" if not g.get("note") else f"  ({g['note']})")
    n = inv["nccl"]
    out += ["", "NCCL", f"  {n['library']} {n['version'] or 'not built in'} from {n.get('source', '-')}"
            if n["library"] else f"  ({n.get('source')})"]
    if check is not None:
        out += ["", f"Check fabric={check['fabric']} ({check['backend']})"]
        for k, v in check["env"].items():
            out.append(f"  {k}={'(unset)' if v is None else v}")
        if check["ready"]:
            out.append("  OK: everything the profile names is present and up"
                       + (", and this container lets NCCL use it" if check.get("container") else ""))
        else:
            out += [f"  FAIL: {p}" for p in check["problems"]]
        out += suggestion_lines(check.get("suggest"))
    return "\n".join(out)


def run(args) -> int:
    root = args.sysfs_root
    if root and not preflight.sysfs_root(root).is_dir():
        raise UsageError(f"--sysfs-root {root} is not a directory")
    if (args.container or args.spec) and not args.overrides:
        flag = "--container" if args.container else "--spec"
        raise UsageError(f"{flag} checks a profile's needs: name one, e.g. fabricbench doctor {flag}"
                         f"{' FILE' if flag == '--spec' else ''} fabric=roce")
    if args.compare:
        return compare_nodes(args.compare)
    if args.spec:
        name, problems = check_specs(args.overrides, args.spec)
        if args.json:
            print(json.dumps({"fabric": name, "specs": args.spec, "ready": not problems, "problems": problems}, indent=1))
        else:
            print("\n".join([f"Run specs for fabric={name}: {', '.join(args.spec)}",
                             *(f"  FAIL: {p}" for p in problems)] if problems else
                            [f"Run specs for fabric={name}: {', '.join(args.spec)}",
                             "  OK: every container setting the profile needs is there"]))
        return 1 if problems else 0
    inv = inventory(root)
    check = check_profile(args.overrides, root, args.container, args.dev_root) if args.overrides else None
    if check is not None:
        check["suggest"] = suggestion(args.overrides, root, args.proc_root)
    if args.json:
        print(json.dumps({"inventory": inv, "check": check}, indent=1))
    else:
        print(render(inv, check))
    return 0 if check is None or check["ready"] else 1
