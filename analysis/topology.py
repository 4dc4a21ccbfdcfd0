"""The fabric's shape in the report: a diagram of each emulated topology the records ran on,
how the bytes spread over a leaf-spine's spines (the records' `paths` blocks), and the
concurrent-jobs summaries (`emulate --jobs`) found beside the records.

Read from the records only (`config.fabric.emulate`, `paths`) and from the emulator's
`jobs-*.json` files; nothing here measures.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from analysis import stats  # noqa: E402
from analysis.load import Run, Table, dig  # noqa: E402

Chart = tuple[Path, str]


def _emulate(r: Run) -> dict | None:
    block = dig(r.record, "config.fabric.emulate")
    return block if isinstance(block, dict) else None


def _key(block: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in block.items() if k in (
        "nodes", "topology", "leaves", "spines", "rate", "uplink_rate", "hash", "spine_rates")))


def describe(block: dict) -> str:
    rate = block.get("rate") or "unshaped"
    if block.get("topology") == "leaf-spine":
        leaves, spines, nodes = int(block.get("leaves", 2)), int(block.get("spines", 2)), int(block.get("nodes", 2))
        up = block.get("uplink_rate") or rate
        slow = block.get("spine_rates") or {}
        up = f"{up}" + (" (" + ", ".join(f"{k}'s {v}" for k, v in sorted(dict(slow).items())) + ")" if slow else "")
        return (f"leaf-spine: {nodes} hosts on {leaves} leaves, {spines} spines; host links {rate}, uplinks {up}, "
                f"ECMP {block.get('hash', 'l4')}")
    nodes = int(block.get("nodes", 2))
    how = "a veth pair" if nodes == 2 and block.get("topology") in (None, "pair") else "one bridge (star)"
    return f"{nodes} nodes on {how}, links {rate}"


def diagram(block: dict, out_dir: Path, name: str) -> Chart:
    """Boxes and lines: spines on top, leaves, hosts below; every link labelled with its rate."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.set_axis_off()
    nodes = int(block.get("nodes", 2))
    rate = str(block.get("rate") or "unshaped")
    hosts_x = [(i + 0.5) / nodes for i in range(nodes)]

    def box(x, y, text, colour):
        ax.text(x, y, text, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "facecolor": colour, "edgecolor": "#333333"})

    if block.get("topology") == "leaf-spine":
        leaves, spines = int(block.get("leaves", 2)), int(block.get("spines", 2))
        per = nodes // leaves
        leaf_x = [(j + 0.5) / leaves for j in range(leaves)]
        spine_x = [(k + 0.5) / spines for k in range(spines)]
        up = str(block.get("uplink_rate") or rate)
        for j, lx in enumerate(leaf_x):
            for sx in spine_x:
                ax.plot([lx, sx], [0.5, 0.9], color="#0072B2", lw=1)
            for i in range(j * per, (j + 1) * per):
                ax.plot([lx, hosts_x[i]], [0.5, 0.1], color="#555555", lw=1)
        ax.text(0.01, 0.7, f"uplinks {up}\nECMP {block.get('hash', 'l4')}", fontsize=7, color="#0072B2")
        ax.text(0.01, 0.28, f"host links {rate}", fontsize=7, color="#555555")
        for k, sx in enumerate(spine_x):
            box(sx, 0.9, f"spine s{k}", "#E6F0F8")
        for j, lx in enumerate(leaf_x):
            box(lx, 0.5, f"leaf l{j}", "#F3E6D8")
    else:
        centre = 0.5
        if nodes == 2 and block.get("topology") in (None, "pair"):
            ax.plot(hosts_x, [0.1, 0.1], color="#555555", lw=1)
        else:
            for hx in hosts_x:
                ax.plot([centre, hx], [0.6, 0.1], color="#555555", lw=1)
            box(centre, 0.6, "bridge", "#F3E6D8")
        ax.text(0.01, 0.3, f"links {rate}", fontsize=7, color="#555555")
    for i, hx in enumerate(hosts_x):
        box(hx, 0.1, f"node {i}", "#E8F4EC")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    return _save(fig, out_dir, name, f"Emulated fabric: {describe(block)}.")


def diagrams(table: Table, out_dir: Path, ctx=None) -> list[Chart]:
    seen: dict[tuple, dict] = {}
    for r in table:
        block = _emulate(r)
        if block:
            seen.setdefault(_key(block), block)
    return [diagram(b, out_dir, f"topology-{i}") for i, b in enumerate(seen.values())]


def shares_by_arm(table: Table) -> dict[str, dict[str, float]]:
    """label -> spine -> the median over its records of that spine's share, normalised to add up
    to 1. Records are grouped by arm and by their set of spines: shares over two spines and over
    one are not the same quantity (a label says which when an arm ran on several)."""
    got: dict[tuple[str, tuple[str, ...]], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in table:
        share = (r.record.get("paths") or {}).get("share") or {}
        if share and all(v is not None for v in share.values()):
            for spine, v in share.items():
                got[(r.arm, tuple(sorted(share)))][spine].append(float(v))
    arms = defaultdict(int)
    for arm, _ in got:
        arms[arm] += 1
    out = {}
    for (arm, spines), d in sorted(got.items()):
        med = {sp: median(v) for sp, v in sorted(d.items())}
        total = sum(med.values()) or 1.0
        label = arm if arms[arm] == 1 else f"{arm} ({len(spines)} spine{'s' if len(spines) != 1 else ''})"
        out[label] = {sp: m / total for sp, m in med.items()}
    return out


def path_shares(table: Table, out_dir: Path, ctx=None) -> list[Chart]:
    data = shares_by_arm(table)
    if not data:
        return []
    arms = sorted(data)
    spines = sorted({s for d in data.values() for s in d})
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.5 * len(arms)))
    left = [0.0] * len(arms)
    colours = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
    for k, s in enumerate(spines):
        vals = [100 * data[a].get(s, 0.0) for a in arms]
        ax.barh(arms, vals, left=left, color=colours[k % 7], label=s)
        left = [x + v for x, v in zip(left, vals)]
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the bytes the spines carried (%, median over records)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return [_save(fig, out_dir, "path-shares", "ECMP: how the bytes between leaves spread over the spines, per arm "
                                               "(each record's `paths`; an even spread is 1/n per spine).")]


def jobs_summaries(root: Path | None) -> list[dict]:
    """The emulator's concurrent-jobs summaries under the report's folder (emulate --jobs)."""
    if root is None or not root.is_dir():
        return []
    out = []
    for p in sorted(root.rglob("jobs-*.json")):
        try:
            s = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(s, dict) and isinstance(s.get("jobs"), list):
            out.append(s | {"_path": str(p)})
    return out


def jobs_chart(root: Path | None, out_dir: Path) -> list[Chart]:
    """Per fabric, each concurrent run's jobs: their JCTs (dots; the run's makespan ringed) and
    Jain's fairness over them (one dot per run). The same summaries as the Concurrent jobs table."""
    by: dict[str, list[dict]] = defaultdict(list)
    for s in jobs_summaries(root):
        by[str(s.get("fabric_name") or "jobs")].append(s)
    if not by:
        return []
    names = sorted(by)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 0.8 + 0.6 * len(names)), sharey=True,
                                      gridspec_kw={"width_ratios": [3, 1]})
    for y, name in enumerate(names):
        for k, s in enumerate(by[name]):
            dy = (k - (len(by[name]) - 1) / 2) * 0.3 / max(len(by[name]), 1)  # runs side by side, not on top
            jcts = [float(j["jct_s"]) for j in s["jobs"] if j.get("jct_s") is not None]
            left.scatter(jcts, [y + dy] * len(jcts), s=14, color="#0072B2")
            if jcts:
                left.scatter([max(jcts)], [y + dy], s=60, facecolors="none", edgecolors="#D55E00")
            if s.get("jain_index") is not None:
                right.scatter([float(s["jain_index"])], [y + dy], s=20, color="#009E73")
    left.set_yticks(range(len(names)), names)
    left.set_xlabel("JCT per job (s); ringed: the run's makespan")
    left.set_xlim(left=0)
    right.set_xlim(0, 1.05)
    right.set_xlabel("Jain over jobs")
    for ax in (left, right):
        ax.grid(True, axis="x", alpha=0.3)
    return [_save(fig, out_dir, "jobs", "Concurrent jobs (emulate --jobs): each job's completion time per run and "
                                        "fabric, and Jain's fairness over each run's jobs (1: the fabric shared evenly).")]


def _save(fig, out_dir: Path, name: str, caption: str) -> Chart:
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    for suffix in (".png", ".svg"):
        fig.savefig(out_dir / f"{name}{suffix}", dpi=100)
    plt.close(fig)
    return out_dir / f"{name}.png", caption


JOBS_HEAD = ["summary", "job", "nodes", "status", "JCT (s)", "metric", "value", "Jain over jobs"]


def jobs_rows(summaries: list[dict], root: Path) -> list[list[str]]:
    rows = []
    for s in summaries:
        name = str(Path(s["_path"]).relative_to(root))
        jain = s.get("jain_index")
        for j in s["jobs"]:
            v = j.get("value")
            rows.append([name, str(j["job"]), ",".join(map(str, j["nodes"])), str(j.get("status") or j.get("exit_code")),
                         f"{j['jct_s']:.2f}", str(j.get("metric") or "n/a"), "n/a" if v is None else f"{v:.4g}",
                         "n/a" if jain is None else f"{jain:.3f}"])
    return rows


RAW_HEAD = ["arm", "raw link (Gbit/s, iperf3 received)", "link runs", "metric", "busbw (Gbit/s)", "% of the raw link"]


def against_raw_link(table: Table) -> list[list[str]]:
    """Per arm that has both: the collectives' peak bus bandwidth as a % of the raw link the same
    arm's link workload measured (the median of its iperf3 `throughput_received(Gbit/s)`). Both are
    payload rates over the fabric's path: what the framework keeps of what the wire gives.
    `peak_busbw(GB/s)` is the record's best message size (large messages approach the link)."""
    raw: dict[str, list[float]] = defaultdict(list)
    bus: dict[str, list[float]] = defaultdict(list)
    for r in table:
        if r.status != "ok":
            continue
        if r.workload == "link" and r.metric("throughput_received(Gbit/s)") is not None:
            raw[r.arm].append(r.metric("throughput_received(Gbit/s)"))
        elif r.workload == "collectives" and r.metric("peak_busbw(GB/s)") is not None:
            bus[r.arm].append(8 * r.metric("peak_busbw(GB/s)"))
    rows = []
    for arm in sorted(raw.keys() & bus.keys()):
        link, got = median(raw[arm]), median(bus[arm])
        rows.append([arm, f"{link:.4g}", str(len(raw[arm])), "peak_busbw (median over records)", f"{got:.4g}",
                     f"{100 * got / link:.1f}%" if link > 0 else "n/a"])
    return rows


def jct_verdicts(summaries: list[dict], baseline: str | None = None) -> list[str]:
    """JCT across fabrics: each concurrent run's makespan (its longest job's JCT) is one sample,
    and every other fabric is compared with the baseline (the report's, else the first by name)
    by the project's loose-runs test (stats.compare: Welch's t on log makespans, its interval, and
    "cannot tell" said as such). The jobs of one run share its fabric at the same moments, so they are
    not independent samples; runs are."""
    by: dict[str, list[float]] = defaultdict(list)
    for s in summaries:
        name, jct = s.get("fabric_name"), (s.get("jct_s") or {}).get("max")
        if name and jct and all(j.get("exit_code") == 0 for j in s["jobs"]):
            by[str(name)].append(float(jct))
    if len(by) < 2:
        return []
    base = baseline if baseline in by else sorted(by)[0]
    out = []
    for name in sorted(by):
        if name != base:
            c = stats.compare(by[name], by[base], name, base, "jct_max(s)", judging=stats.Judging(word="faster", higher_is_better=False))
            out.append(f"JCT (the makespan of each run's jobs): {stats.verdict(c)}")
    return out
