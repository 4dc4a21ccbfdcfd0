"""Run nccl-tests' / rccl-tests' `all_reduce_perf` with our sweep and read its results
into the same row shape as ours, so both sit side by side in one record.

Two readers:
- the stdout table (every version): data lines are 5 leading columns (size, count,
  type, redop, root; older binaries print fewer) followed by two groups of
  time(us) algbw busbw #wrong, out-of-place then in-place; `#wrong` may be `N/A`;
  the footer has `# Avg bus bandwidth    : <g>` and `# Out of bounds values : <n> OK`.
- the `-J <file>.json` report (nccl-tests >= 2.17, file version 2): `results` is a
  list of {size, count, type, redop, root, out_of_place: {time, alg_bw, bus_bw, nwrong},
  in_place: {...}}, with `average_bus_bandwidth.bandwidth` and `out_of_bounds.count`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from workloads.collectives.settings import Checks, Settings, Sweep, Timing, launch_prefix

AVERAGE_FLAG = {"rank0": "0", "mean": "1", "min": "2", "max": "3"}
_AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+|nan|inf)", re.I)
_OOB_RE = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)", re.I)
_START_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_STAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2}")
# writeDeviceReport (nccl-tests src/util.cu, v2.13.10 on; rccl-tests the same): one line per
# GPU, "#  Rank %2d Group %2d Pid %6d on %10s device %2d ...", group = that process's colour.
_DEVICE_RE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\b")


def _num(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None  # "N/A"


def _cell(time_s: str, alg: str, bus: str, wrong: str) -> dict[str, Any] | None:
    t, a, b = _num(time_s), _num(alg), _num(bus)
    if t is None or a is None or b is None:
        return None
    w = _num(wrong)
    return {"time_us": t, "algbw": a, "busbw": b, "wrong": None if w is None else int(w)}


def op_from_binary(name: str) -> str:
    """all_reduce_perf -> all_reduce; alltoall_perf -> alltoall."""
    return re.sub(r"_perf(_mpi)?$", "", Path(name).name)


def parse_table(text: str, op: str = "all_reduce") -> dict[str, Any]:
    rows, avg, oob = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            if m := _AVG_RE.match(s):
                avg = float(m.group(1))
            elif m := _OOB_RE.match(s):
                oob = int(m.group(1))
            elif m := _START_RE.match(s):
                op = op_from_binary(m.group(1))
            continue
        tok = s.split()
        while tok and _STAMP_RE.fullmatch(tok[-1]):  # -S 1 appends a date and a time
            tok.pop()
        # A data line: 3..5 leading columns (two integers first), then 8 result columns.
        lead = len(tok) - 8
        if not 3 <= lead <= 5 or not (tok[0].isdigit() and tok[1].isdigit()):
            continue
        head, res = tok[:lead], tok[lead:]
        rows.append({
            "op": op, "size": int(head[0]), "count": int(head[1]), "type": head[2],
            "redop": head[3] if lead >= 4 else "none", "root": int(head[4]) if lead >= 5 else -1,
            "out_of_place": _cell(*res[0:4]), "in_place": _cell(*res[4:8]),
        })
    return {"rows": rows, "avg_busbw": avg, "out_of_bounds": oob}


def parse_json(obj: dict[str, Any], op: str = "all_reduce") -> dict[str, Any]:
    def cell(c):
        if not c:
            return None
        nwrong = c.get("nwrong")
        return {"time_us": float(c.get("time", c.get("cpu_time"))), "algbw": float(c["alg_bw"]),
                "busbw": float(c["bus_bw"]), "wrong": None if nwrong is None else int(float(nwrong))}

    rows = [{
        "op": op, "size": int(r["size"]), "count": int(r["count"]), "type": r["type"], "redop": r["redop"],
        "root": int(str(r["root"]).strip()), "out_of_place": cell(r.get("out_of_place")),
        "in_place": cell(r.get("in_place")),
    } for r in obj.get("results", [])]
    avg = (obj.get("average_bus_bandwidth") or {}).get("bandwidth")
    oob = (obj.get("out_of_bounds") or {}).get("count")
    return {"rows": rows, "avg_busbw": None if avg in (None, "nan") else float(avg), "out_of_bounds": oob}


def supports_json(binary: str, timeout_s: float = 30) -> bool:
    try:
        out = subprocess.run([binary, "-h"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "-J" in (out.stdout + out.stderr)


def device_groups(text: str) -> list[list[int]]:
    """The communicators the binary actually built, from its device lines: one list of
    ranks per group, in group order ([] when the binary printed none)."""
    groups: dict[int, list[int]] = {}
    for line in text.splitlines():
        if m := _DEVICE_RE.match(line.strip()):
            groups.setdefault(int(m.group(2)), []).append(int(m.group(1)))
    return [sorted(groups[g]) for g in sorted(groups)]


def build_command(binary: str, s: Sweep, timing: Timing, checks: Checks, gpus: int, json_path: Path | None,
                  prefix: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The same sweep in nccl-tests' flags, after the (filled-in) launcher prefix."""
    cmd = [*prefix, binary, "-b", str(min(s.sizes)), "-e", str(max(s.sizes))]
    if len(s.sizes) > 1 and s.sizes[1] % s.sizes[0] == 0 and s.sizes[1] // s.sizes[0] > 1 and \
            all(b == a * (s.sizes[1] // s.sizes[0]) for a, b in zip(s.sizes, s.sizes[1:])):
        cmd += ["-f", str(s.sizes[1] // s.sizes[0])]
    elif len(s.sizes) > 1:
        cmd += ["-f", "1", "-i", str(s.sizes[1] - s.sizes[0])]
    cmd += ["-n", str(timing.iters), "-w", str(timing.warmup_iters), "-d", s.datatype, "-o", s.redop,
            "-r", str(s.root), "-c", "1" if checks.elements else "0", "-a", AVERAGE_FLAG[timing.average],
            "-g", str(gpus)]
    if json_path is not None:
        cmd += ["-J", str(json_path)]
    return cmd


def split_env(pattern: str, world: int, ranks_per_node: int) -> dict[str, str]:
    """nccl-tests' NCCL_TESTS_SPLIT for our traffic pattern. Its colour is per MPI process
    (src/common.cu run(): `color = proc % N`, then MPI_Comm_split), so "MOD m" gives our
    split communicators (settings.py pattern_groups) only with one process per GPU (-g 1)."""
    if pattern == "one_per_node":
        return {"NCCL_TESTS_SPLIT": f"MOD {ranks_per_node}"}
    if pattern == "pairs":
        return {"NCCL_TESTS_SPLIT": f"MOD {world // 2}"}
    return {}


def external_scope(prefix: tuple[str, ...] | list[str], nodes: int) -> str:
    """What the external run spans. Without a launcher prefix it is one process on rank 0's
    node driving -g <local ranks> GPUs: on a multi-node job that measures NVLink/PCIe inside
    one node, not the fabric, so it is labelled "intra-node". With a prefix (mpirun/srun) or
    on a one-node job it covers the same ranks as our run: "job"."""
    return "intra-node" if nodes > 1 and not prefix else "job"


def summary_line(block: dict[str, Any]) -> str | None:
    """The line printed under our tables; None when the binary gave no average and no
    reason. A run refused for measuring other communicators prints why, not its figure."""
    if block.get("reason") and (block.get("status") == "failed" or block.get("env")):
        return f"# external {block.get('binary', '')}: {block['status']}: {block['reason']}"
    if block.get("avg_busbw") is None:
        return None
    line = f"# external {block['binary']}: avg bus bandwidth {block['avg_busbw']:g} GB/s ({block['source']})"
    if block.get("scope") == "intra-node":
        line += (f" -- INTRA-NODE ONLY: one process with -g {block['gpus']} on rank 0's node of a "
                 f"{block['nodes']}-node job, so NVLink/PCIe, not the fabric; set collectives.external_prefix "
                 "(an mpirun/srun command) to run it across the job")
    return line


def run_external(s: Settings, out_dir: Path, gpus: int, nodes: int = 1,
                 env: dict[str, str] | None = None, prefix: list[str] | tuple[str, ...] = (),
                 expect_groups: list[list[int]] | None = None) -> dict[str, Any]:
    """Run the binary once (rank 0 only) and return the record's `external` block. `gpus`
    is -g; `nodes` the job's node count, for the block's `scope`; `env` extra variables for
    the binary (NCCL_TESTS_SPLIT from split_env); `prefix` the filled-in launcher;
    `expect_groups` our communicators, which the binary's own device lines must match."""
    binary = shutil.which(s.external.binary)
    if binary is None:
        return {"status": "skipped", "reason": f"{s.external.binary} is not on PATH"}
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{Path(binary).name}.json" if supports_json(binary) else None
    cmd = build_command(binary, s.sweep, s.timing, s.checks, gpus, json_path, prefix)
    block: dict[str, Any] = {"binary": binary, "command": cmd, "scope": external_scope(prefix, nodes),
                             "nodes": nodes, "gpus": gpus, "env": dict(env or {})}
    run_env = {**os.environ, **(env or {})}
    if "NCCL_DEBUG_FILE" in run_env:
        # its own folder: <run dir>/nccl is ours, read for the algorithms behind our rows
        # (linerate.algorithms_in); the binary's tuning lines there would be taken for ours
        run_env["NCCL_DEBUG_FILE"] = str(out_dir / "nccl.%h.%p.log")
        block["nccl_log"] = run_env["NCCL_DEBUG_FILE"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=s.external.timeout_s, env=run_env)
    except subprocess.TimeoutExpired:
        return block | {"status": "failed", "reason": f"timed out after {s.external.timeout_s:g}s"}
    except OSError as e:
        return block | {"status": "failed", "reason": str(e)}
    (out_dir / f"{Path(binary).name}.out").write_text(proc.stdout + proc.stderr)
    op = op_from_binary(binary)
    parsed, source = parse_table(proc.stdout, op), "table"
    if json_path is not None and json_path.exists():
        try:
            parsed, source = parse_json(json.loads(json_path.read_text()), op), "json"
        except (ValueError, KeyError, TypeError):
            pass  # a truncated report (the binary died): the table is still there
    status = "ok" if proc.returncode == 0 and parsed["rows"] else "failed"
    groups = device_groups(proc.stdout)
    reason = _group_mismatch(groups, expect_groups, block["env"]) if status == "ok" else None
    if reason:
        # figures of other communicators are not kept beside ours (the raw output stays in <binary>.out)
        status, parsed = "failed", {"rows": [], "avg_busbw": None, "out_of_bounds": parsed["out_of_bounds"]}
    return block | {"status": status, "returncode": proc.returncode, "source": source, **parsed, "groups": groups,
                    "stderr_tail": proc.stderr[-2000:] if status != "ok" else ""} | ({"reason": reason} if reason else {})


def _group_mismatch(groups: list[list[int]], expect: list[list[int]] | None, env: dict[str, str]) -> str | None:
    """Why the binary's communicators are not ours, or None. Without its device lines a
    split run cannot be trusted (the split is silently ignored outside MPI)."""
    if expect is None:
        return None
    if not groups:
        return ("its output has no '#  Rank r Group g' device lines, so the communicators it measured cannot be "
                "checked against ours" if env else None)
    if groups != expect:
        return (f"it measured communicators {_show(groups)}, ours are {_show(expect)}: nccl-tests colours whole "
                "processes, so collectives.external_prefix must start one process per GPU, e.g. "
                "[mpirun, -np, '{world}', -N, '{ranks_per_node}']")
    return None


def _show(groups: list[list[int]]) -> str:
    """[[0, 8], [1, 9], ...] shortened to the first two groups and a count."""
    head = ", ".join(str(g) for g in groups[:2])
    return f"[{head}{f', ... ({len(groups)} groups)' if len(groups) > 2 else ''}]"


def run_external_alone(s: Settings, out_dir: Path, info, ranks_per_node: int) -> dict[str, Any] | None:
    """Every rank calls this; rank 0 runs the binary (with our pattern's NCCL_TESTS_SPLIT)
    while the others wait on the host (a Gloo barrier), not in a GPU-spinning NCCL kernel of
    the next point: nothing of ours time-shares the GPUs with it. Rank 0 gets the block."""
    from workloads.core import dist as fdist

    fdist.host_barrier(s.external.timeout_s + 60)
    block = None
    if info.is_main:
        block = run_planned(s, out_dir, info, ranks_per_node)
    fdist.host_barrier(s.external.timeout_s + 60)
    return block


def run_planned(s: Settings, out_dir: Path, info, ranks_per_node: int) -> dict[str, Any]:
    """With a prefix the binary runs one process per GPU (-g 1), the only layout in which
    NCCL_TESTS_SPLIT reproduces our pattern; without one, a single process drives rank 0's
    local GPUs (-g <local ranks>), where a split pattern cannot be reproduced at all."""
    from workloads.collectives.settings import pattern_groups

    pattern = s.grouping.pattern
    env = split_env(pattern, info.world_size, ranks_per_node)
    prefix = launch_prefix(s.external.prefix, info.world_size, info.nodes, ranks_per_node)
    if env and not prefix:
        return {"status": "skipped", "env": env,
                "reason": f"pattern={pattern} needs collectives.external_prefix: NCCL_TESTS_SPLIT colours MPI "
                          "processes (nccl-tests src/common.cu run()), and without a launcher there is one process, "
                          "so the split would be ignored; give e.g. [mpirun, -np, '{world}', -N, '{ranks_per_node}']"}
    scope = external_scope(prefix, info.nodes)
    expect = pattern_groups(pattern, info.world_size, ranks_per_node) if scope == "job" else None
    return run_external(s, out_dir, 1 if prefix else info.local_world_size, info.nodes, env=env, prefix=prefix,
                        expect_groups=expect)
