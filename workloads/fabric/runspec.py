"""Run specs read statically: the container flags users write (docker/podman run lines in shell
scripts, batch files and Markdown; `srun --container-image` for pyxis; Kubernetes pod specs),
checked for the settings under which NCCL or UCX would quietly leave the fabric. It is the same
list as workloads/fabric/readiness.py, which reads them from inside a running container; this
one catches them before a job is submitted.

- verbs devices: `--device=/dev/infiniband` (or `--privileged`); Kubernetes: an RDMA
  device-plugin resource (`rdma/...`, k8s-rdma-shared-dev-plugin; the NVIDIA network
  operator's `nvidia.com/...rdma...`/`hostdev`/`sriov...`) or `privileged: true`; pyxis: enroot's
  `99-mellanox` hook mounts the devices only when `MELLANOX_VISIBLE_DEVICES` is set;
- pinning: `--cap-add=IPC_LOCK` or `--ulimit memlock=-1` (either lifts the limit on registered
  memory); Kubernetes cannot set a memlock limit, so `capabilities.add: [IPC_LOCK]`;
- `/dev/shm`: `--ipc=host` or `--shm-size` of at least 1 GiB; Kubernetes: `hostIPC: true` or an
  `emptyDir` of `medium: Memory` mounted at `/dev/shm` (no `sizeLimit`, or at least 1 GiB).

An OCI bundle's `config.json` (what `srun --container` runs, and what docker and podman hand to
runc) says the same in the runtime spec's own fields: `linux.devices`, `process.capabilities`,
`process.rlimits` and the `/dev/shm` mount's `size=`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from workloads.fabric.readiness import SHM_MIN

# docker/podman run flags that take the next word as their value (when written without `=`).
_VALUED = {"-v", "--volume", "-e", "--env", "--env-file", "--device", "--ulimit", "--cap-add", "--cap-drop",
           "--shm-size", "--ipc", "--network", "--net", "--name", "-w", "--workdir", "--gpus", "--runtime",
           "--mount", "--entrypoint", "-u", "--user", "--security-opt", "--label", "-l", "-p", "--publish",
           "--hostname", "-h", "--memory", "-m", "--cpus", "--pull", "--platform", "--add-host", "--tmpfs"}
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_K8S_UNITS = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40,
              "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


@dataclass(frozen=True)
class Needs:
    """Which settings the profile depends on."""

    ib: bool     # NCCL over IB verbs: devices and pinning
    shm: bool    # NCCL between a node's ranks: /dev/shm


def _docker_size(v: str) -> int | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgt]?)b?", v.strip().lower())
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def _k8s_size(v: Any) -> int | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(v).strip())
    return int(float(m.group(1)) * _K8S_UNITS[m.group(2) or ""]) if m else None


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with backslash continuations joined."""
    buf, start = "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        yield start, buf + line
        buf = ""
    if buf:
        yield start, buf


def _run_flags(words: list[str]) -> dict[str, list[str]] | None:
    """The options of a `docker run`/`podman run` in `words` (global options before `run`
    allowed), as {flag: [values]}; None when the words are not one."""
    for i, w in enumerate(words):
        if w.rsplit("/", 1)[-1] in ("docker", "podman") and "run" in words[i + 1:]:
            j = words.index("run", i + 1)
            if any(not x.startswith("-") and x not in ("runc", "crun") for x in words[i + 1:j]):
                continue  # `run` is an argument further on, not the subcommand
            break
    else:
        return None
    flags: dict[str, list[str]] = {}
    k = j + 1
    while k < len(words) and words[k].startswith("-"):
        name, eq, value = words[k].partition("=")
        if not eq and name in _VALUED and k + 1 < len(words):
            value, k = words[k + 1], k + 1
        flags.setdefault(name, []).append(value)
        k += 1
    return flags


def lint_run(flags: dict[str, list[str]], needs: Needs) -> list[str]:
    privileged = "--privileged" in flags
    problems = []
    if needs.ib and not privileged and not any(v.split(":")[0].startswith("/dev/infiniband")
                                               for v in flags.get("--device", [])):
        problems.append("no --device=/dev/infiniband: NCCL finds no IB device in the container and silently uses "
                        "NET/Socket; fix: add --device=/dev/infiniband")
    caps = {c.upper().removeprefix("CAP_") for v in flags.get("--cap-add", []) for c in v.split(",")}
    memlock = [v.split("=", 1)[1] for v in flags.get("--ulimit", []) if v.startswith("memlock=")]
    unlimited = any(v.split(":")[0] in ("-1", "unlimited") for v in memlock)
    user = (flags.get("--user") or flags.get("-u") or ["0"])[-1].split(":")[0]
    userns = (flags.get("--userns") or [""])[-1]
    # CAP_IPC_LOCK lifts memlock only for root in the initial user namespace (readiness.py)
    cap_counts = (privileged or caps & {"IPC_LOCK", "ALL"}) and user in ("0", "root") and userns in ("", "host")
    if needs.ib and not (cap_counts or unlimited):
        if caps & {"IPC_LOCK", "ALL"} and user not in ("0", "root"):
            why = (f"--user {user} with --cap-add=IPC_LOCK: a non-root user's capability is not effective after "
                   "exec (docker and podman set no ambient capabilities), so the runtime's memlock limit (a few "
                   "MiB) bounds registered memory")
        elif caps & {"IPC_LOCK", "ALL"} or privileged:
            why = (f"--userns={userns}: in a user namespace CAP_IPC_LOCK lifts no limit (the kernel asks "
                   "capable() of the initial one), so the runtime's memlock limit (a few MiB) bounds registered "
                   "memory")
        else:
            why = ("neither --cap-add=IPC_LOCK nor --ulimit memlock=-1: the runtime's memlock limit (a few MiB) "
                   "bounds registered memory")
        problems.append(f"{why}; ibv_reg_mr fails with ENOMEM (NCCL aborts, UCX drops to tcp); fix: add --ulimit "
                        "memlock=-1 (within the host's hard limit, ulimit -Hl; for root in a rootful container "
                        "--cap-add=IPC_LOCK is enough)")
    net = [*flags.get("--network", []), *flags.get("--net", [])]
    if needs.ib and (not net or net[-1] in ("bridge", "default", "none", "slirp4netns", "pasta")):
        # RoCE's GIDs and NCCL_SOCKET_IFNAME are the host's interfaces; a bridge netns has neither
        problems.append(f"{'--network=' + net[-1] if net else 'no --network=host'}: on the runtime's own network NCCL_SOCKET_IFNAME's interface does not "
                        "exist (\"Bootstrap : no socket interface found\") and ranks bootstrap to container "
                        "addresses the other nodes cannot reach; fix: add --network=host (or a secondary network "
                        "on the RDMA NIC, e.g. Multus)")
    shm = [_docker_size(v) for v in flags.get("--shm-size", [])]
    if needs.shm and "host" not in flags.get("--ipc", []) and not any(s and s >= SHM_MIN for s in shm):
        problems.append(f"{'--shm-size=' + flags['--shm-size'][-1] if shm else 'no --ipc=host or --shm-size'}: "
                        "/dev/shm is below 1 GiB (the runtime's default is 64 MB) and NCCL's SHM transport fails "
                        "when it fills; fix: add --ipc=host or --shm-size=16g")
    return problems


def lint_text(text: str, needs: Needs) -> list[tuple[int, str]]:
    """(line, problem) for each docker/podman run line and pyxis srun in a script or document."""
    out = []
    pyxis_env = re.search(r"^\s*(export\s+)?MELLANOX_VISIBLE_DEVICES=", text, re.M)
    for n, line in _logical_lines(text):
        code = line.split(" #", 1)[0].strip().strip("`")
        if not code or code.startswith("#"):
            continue
        try:
            words = shlex.split(code)
        except ValueError:
            continue  # not shell (prose with a lone quote)
        flags = _run_flags(words)
        if flags is not None:
            out += [(n, p) for p in lint_run(flags, needs)]
        elif needs.ib and "srun" in words and any(w.startswith("--container-image") for w in words) \
                and not pyxis_env and not _mounts_infiniband(words):
            out.append((n, "srun --container-image (pyxis) without MELLANOX_VISIBLE_DEVICES in this file: enroot's "
                           "99-mellanox hook then mounts no /dev/infiniband and NCCL silently uses NET/Socket; fix: "
                           "export MELLANOX_VISIBLE_DEVICES=all (or set it in enroot.conf), or --container-mounts=/dev/infiniband"))
    return out


def _mounts_infiniband(words: list[str]) -> bool:
    """pyxis `--container-mounts=SRC[:DST[:FLAGS]],...` binding /dev/infiniband: the devices are
    there without enroot's hook."""
    vals = [w.split("=", 1)[1] for w in words if w.startswith("--container-mounts=")]
    vals += [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--container-mounts"]
    return any(m.split(":")[0].rstrip("/").startswith("/dev/infiniband") or m.rstrip("/") == "/dev"
               for v in vals for m in v.split(","))


def _rdma_resource(name: str) -> bool:
    return name.startswith("rdma/") or (name.startswith("nvidia.com/")
                                        and any(s in name for s in ("rdma", "hostdev", "sriov", "hca")))


def _pod_specs(doc: Any, where: str = "") -> Iterator[tuple[str, dict]]:
    """Every pod spec in a manifest (a Pod, or a template of a Job, Deployment, ...)."""
    if isinstance(doc, dict):
        if isinstance(doc.get("containers"), list):
            yield where, doc
            return
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
        here = f"{doc.get('kind', '').lower()}/{name}" if doc.get("kind") and name else where
        for v in doc.values():
            yield from _pod_specs(v, here)
    elif isinstance(doc, list):
        for v in doc:
            yield from _pod_specs(v, where)


def lint_pod(spec: dict, needs: Needs) -> list[tuple[str, str]]:
    """(container, problem) for one pod spec."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    out = []
    for c in spec.get("containers") or []:
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        privileged = bool(sc.get("privileged"))
        res = c.get("resources") or {}
        names = {*(res.get("limits") or {}), *(res.get("requests") or {})}
        if needs.ib and not privileged and not any(_rdma_resource(n) for n in names):
            out.append((name, "requests no RDMA device-plugin resource: /dev/infiniband is empty in the container "
                              "and NCCL silently uses NET/Socket; fix: resources.limits with the plugin's resource, "
                              "e.g. rdma/rdma_shared_device_a: 1"))
        caps = {str(x).upper().removeprefix("CAP_") for x in ((sc.get("capabilities") or {}).get("add") or [])}
        if needs.ib and not privileged and not caps & {"IPC_LOCK", "ALL"}:
            out.append((name, "no IPC_LOCK: a pod spec cannot raise memlock, so registered memory is bounded by the "
                              "runtime's limit and ibv_reg_mr fails with ENOMEM (NCCL aborts, UCX drops to tcp); "
                              "fix: securityContext.capabilities.add: [IPC_LOCK]"))
        if needs.shm and not spec.get("hostIPC"):
            ok = False
            for m in c.get("volumeMounts") or []:
                v = volumes.get(m.get("name")) or {}
                ed = v.get("emptyDir") if isinstance(v.get("emptyDir"), dict) else None
                if m.get("mountPath", "").rstrip("/") == "/dev/shm" and ed is not None and ed.get("medium") == "Memory":
                    size = _k8s_size(ed["sizeLimit"]) if ed.get("sizeLimit") is not None else None
                    ok = ed.get("sizeLimit") is None or (size is not None and size >= SHM_MIN)
            if not ok:
                out.append((name, "/dev/shm is not a memory emptyDir of at least 1Gi (nor hostIPC), so it is the "
                                  "runtime's 64 MiB or the sizeLimit: NCCL's SHM transport fails when it fills; fix: "
                                  "a volume emptyDir: {medium: Memory} mounted at /dev/shm"))
    return out


# RLIMIT_MEMLOCK of an OCI config: uint64, RLIM_INFINITY written out.
_RLIM_INFINITY = (1 << 64) - 1


# The fields lint_oci reads, with the JSON type opencontainers/runtime-spec config.md (and
# config-linux.md) gives them: process.env is "array of strings" in environ's NAME=value form.
_OCI_SHAPE = (("process", dict), ("process.env", list), ("process.capabilities", dict),
              ("process.capabilities.effective", list), ("process.rlimits", list), ("mounts", list),
              ("linux", dict), ("linux.devices", list))
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean"}


def oci_shape(cfg: dict) -> str | None:
    """The first field lint_oci reads whose JSON type is not the runtime spec's, as a problem
    naming it; None when every present one fits. A malformed field is not read as absent:
    a bundle whose process.env is one string would otherwise be linted as if it set nothing."""
    for key, want in _OCI_SHAPE:
        node: object = cfg
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, want):
            return f"{key} is {_JSON_TYPES.get(type(node), type(node).__name__)}, not {_JSON_TYPES[want]}"
    env = (cfg.get("process") or {}).get("env") or []
    bad = next((e for e in env if not isinstance(e, str) or "=" not in e), None)
    if bad is not None:
        return f"process.env holds {json.dumps(bad)}, not a NAME=value string"
    return None


def lint_oci(cfg: dict, needs: Needs) -> list[str]:
    """One problem per setting an OCI runtime config (a bundle's config.json) lacks."""
    proc = cfg.get("process") or {}
    lin = cfg.get("linux") or {}
    mounts = [m for m in cfg.get("mounts") or [] if isinstance(m, dict)]
    problems = []
    devices = [str(d.get("path", "")) for d in lin.get("devices") or [] if isinstance(d, dict)]
    bound = any(m.get("destination", "").rstrip("/") in ("/dev/infiniband", "/dev") and "bind" in " ".join(
        [m.get("type") or "", *(m.get("options") or [])]) for m in mounts)
    if needs.ib and not bound and not any(d.startswith("/dev/infiniband/uverbs") for d in devices):
        problems.append("no /dev/infiniband/uverbsN in linux.devices (nor /dev/infiniband bound in mounts): NCCL "
                        "finds no IB device in the container and silently uses NET/Socket; fix: add each "
                        "/dev/infiniband/uverbsN (and rdma_cm) to linux.devices")
    caps = {str(c).upper().removeprefix("CAP_") for c in ((proc.get("capabilities") or {}).get("effective") or [])}
    memlock = [r for r in proc.get("rlimits") or [] if isinstance(r, dict) and r.get("type") == "RLIMIT_MEMLOCK"]
    unlimited = any(r.get("soft") == _RLIM_INFINITY and r.get("hard") == _RLIM_INFINITY for r in memlock)
    userns = any(isinstance(n, dict) and n.get("type") == "user" for n in lin.get("namespaces") or []) \
        or bool(lin.get("uidMappings"))
    uid = (proc.get("user") or {}).get("uid", 0)
    ambient = {str(c).upper().removeprefix("CAP_") for c in ((proc.get("capabilities") or {}).get("ambient") or [])}
    if needs.ib and "IPC_LOCK" in caps and not unlimited and userns:
        problems.append("the bundle runs in a user namespace (linux.namespaces has user; runc spec --rootless, or "
                        "Slurm's rootless runc), where CAP_IPC_LOCK lifts no limit (the kernel asks capable() of "
                        "the initial namespace): ibv_reg_mr fails with ENOMEM past the memlock limit the job "
                        "inherited; fix: an unlimited RLIMIT_MEMLOCK in process.rlimits, which an unprivileged "
                        "runc can set only when the job's hard limit is unlimited (Slurm: "
                        "PropagateResourceLimitsExcept=MEMLOCK, slurmd with LimitMEMLOCK=infinity)")
    elif needs.ib and "IPC_LOCK" in caps and not unlimited and uid != 0 and "IPC_LOCK" not in ambient:
        problems.append(f"process.user.uid {uid} with CAP_IPC_LOCK in effective but not in ambient: execve drops a "
                        "non-root user's capabilities unless they are ambient, so the memlock limit bounds "
                        "registered memory and ibv_reg_mr fails with ENOMEM; fix: add CAP_IPC_LOCK to "
                        "process.capabilities.ambient and inheritable, or an unlimited RLIMIT_MEMLOCK")
    elif needs.ib and "IPC_LOCK" not in caps and not unlimited:
        problems.append("neither CAP_IPC_LOCK in process.capabilities nor an unlimited RLIMIT_MEMLOCK in "
                        "process.rlimits: the inherited memlock limit bounds registered memory, ibv_reg_mr fails "
                        "with ENOMEM (NCCL aborts, UCX drops to tcp); fix: add CAP_IPC_LOCK to process.capabilities"
                        f" (bounding, effective, permitted) or {{\"type\": \"RLIMIT_MEMLOCK\", \"hard\": "
                        f"{_RLIM_INFINITY}, \"soft\": {_RLIM_INFINITY}}} to process.rlimits")
    if needs.shm:
        shm = [m for m in mounts if m.get("destination", "").rstrip("/") == "/dev/shm"]
        opts = [o for m in shm for o in m.get("options") or []]
        sizes = [_docker_size(o.split("=", 1)[1]) for o in opts if o.startswith("size=")]
        host = any(m.get("source", "").rstrip("/") == "/dev/shm" for m in shm)
        if not host and not (shm and (not sizes or any(z and z >= SHM_MIN for z in sizes))):
            size = next((o[len("size="):] for o in opts if o.startswith("size=")), None)
            what = f"/dev/shm mounted with size={size}" if size else "no /dev/shm mount"
            problems.append(f"{what}: /dev/shm is below 1 GiB and NCCL's SHM transport fails when it fills; fix: "
                            "a tmpfs mount at /dev/shm with size=16g (or the host's /dev/shm bound there)")
    return problems


def lint_file(path: str | Path, needs: Needs) -> list[str]:
    """One line per problem: `path:line: ...` or `path: pod/x container y: ...`."""
    p = Path(path)
    text = p.read_bytes().decode()  # UnicodeDecodeError: the caller names the file (doctor.check_specs)
    if p.suffix in (".yaml", ".yml"):
        import yaml

        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as e:
            return [f"{p}: not YAML ({str(e).splitlines()[0]}); fix the manifest"]
        return [f"{p}: {where or 'pod'} container {c}: {why}"
                for d in docs for where, spec in _pod_specs(d) for c, why in lint_pod(spec, needs)]
    if p.suffix == ".json":
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            return [f"{p}: not JSON ({e}); fix the bundle's config.json"]
        if not isinstance(cfg, dict) or "ociVersion" not in cfg:
            return [f"{p}: not an OCI runtime config (no ociVersion); name a bundle's config.json"]
        if why := oci_shape(cfg):
            return [f"{p}: {why} (the OCI runtime spec's config.json); fix the bundle's config.json"]
        return [f"{p}: {why}" for why in lint_oci(cfg, needs)]
    return [f"{p}:{n}: {why}" for n, why in lint_text(text, needs)]
