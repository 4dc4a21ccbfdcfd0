"""The all_reduce bus bandwidth a healthy system of a given class reaches, and its source,
so a collectives figure is judged as a share of what that class can do, never against an
absolute GB/s that holds on one box only (users ask for this: NVIDIA/nccl-tests#367).

The class comes from what the run itself recorded: the GPU model (fingerprint), whether
NCCL's topology shows NVLink between the GPUs (GRAPH line `NVL`, topology dump `gpu_links`;
RCCL's `XGMI` is AMD's GPU fabric, with no band on file), and the node count. Multi-node runs are judged against one communicator's line rate over the
rails its channels used (linerate.py, `record.line_rate`: the node's NIC aggregate for a
communicator that spans whole nodes), which already has its source (sysfs).

Intra-node NVLink, per GPU, one direction (vendor datasheets: "NVLink bandwidth" is the
bidirectional total):
  A100 SXM 600 GB/s -> 300; H100/H200 SXM 900 -> 450; B200/GB200 1800 -> 900.
NCCL's effective NVLink bandwidth is ~80% of that line rate (~20% protocol overhead: NCCL's
maintainer, NVIDIA/nccl-tests#212, "450GB/s is the line rate ... NCCL can get an effective
NVLink bandwidth of 370GB/s"); NVLink SHARP all_reduce on 8 H100 reaches ~480 GB/s busbw
(same comment), 475 on 8 H200 (nccl-tests#272): ~1.07x the line rate, so a figure above 1.2x
the line rate is a timing error, not a fast box. The same comment warns that 256 MiB is
"too small to reach peak bandwidth", so the floor at gpu-check's largest size is half the
effective rate.
"""

from __future__ import annotations

from dataclasses import dataclass

NVLINK_GBPS = {"A100": 300.0, "H100": 450.0, "H200": 450.0, "B200": 900.0, "GB200": 900.0}
NVLINK_SOURCE = "NVLink line rate per direction (datasheet: A100 600, H100/H200 900, B200 1800 GB/s both ways)"
EFFECTIVE = 0.80   # nccl-tests#212: 370 of 450 GB/s
FLOOR = 0.5        # of EFFECTIVE x line, at sizes below the peak (256 MiB, nccl-tests#212)
TOP = 1.2          # of the line rate: NVLS reaches ~1.07x (nccl-tests#212, #272)
# PCIe: NCCL rates a link at width x (12 Gbit/s per lane at 16 GT/s, 6 at 8 GT/s, ...) / 8
# (graph/topo.cc kvDictPciGen, `bw = width * speed / 80.0`): gen4 x16 is 24 GB/s, while the wire
# carries 16 GT/s x 128/130 = 15.75 Gbit/s per lane, 1.3125x NCCL's figure. That raw rate is
# the top; no floor is stated, since paths through the CPU's root complex are much slower and
# no sourced figure was found.
PCIE_RAW_OVER_NCCL = 15.75 / 12.0
# Board variants with other NVLink (H100 NVL/PCIe: bridges of 600 GB/s between pairs only).
_OTHER_VARIANTS = ("PCIE", "NVL")


@dataclass(frozen=True)
class Ceiling:
    line_gbps: float | None   # GB/s, per rank, one direction
    low_gbps: float | None
    high_gbps: float | None
    source: str

    def judge(self, busbw: float) -> bool | None:
        if self.high_gbps is None:
            return None
        return (self.low_gbps or 0.0) <= busbw <= self.high_gbps

    def expected(self) -> str:
        """The band, short; `source` says where it comes from (or why there is none)."""
        if self.high_gbps is None:
            return "n/a"
        if self.low_gbps is None:
            return f"<= {self.high_gbps:.1f} GB/s, no floor"
        return f"{self.low_gbps:.0f}-{self.high_gbps:.0f} GB/s"


def nvlink_rate(gpu: str) -> float | None:
    upper = gpu.upper()
    for key in sorted(NVLINK_GBPS, key=len, reverse=True):
        if key in upper:
            return None if any(v in upper.replace(key, "") for v in _OTHER_VARIANTS) else NVLINK_GBPS[key]
    return None


def all_reduce_ceiling(rec: dict) -> Ceiling:
    """The band a collectives record's largest all_reduce busbw must fall in."""
    world = rec.get("world") or {}
    if int(world.get("world_size") or 0) < 2:
        return Ceiling(None, None, None, "one rank: nothing crosses a link")
    summary = (((rec.get("fabric") or {}).get("transport") or {}).get("summary")) or {}
    multi = int(world.get("nodes") or 1) > 1
    if summary.get("backend") == "gloo" and not multi:
        return Ceiling(None, None, None, "Gloo on one host: memory copies, no link class")
    if multi:
        lr = rec.get("line_rate") or {}
        per_comm = lr.get("per_comm(GB/s)")
        if not per_comm:
            return Ceiling(None, None, None, "multi-node, but the rails' line rate is unknown (record.line_rate)")
        share = int(lr.get("comms_per_node") or 1)
        basis = "the node's NIC aggregate" if share == 1 else f"the node's rate / {share} communicators crossing it"
        return Ceiling(per_comm, FLOOR * EFFECTIVE * per_comm, TOP * per_comm,
                       f"line rate {per_comm:g} GB/s per communicator ({basis}) of the rails the channels used "
                       "(sysfs)")
    gpu = str((rec.get("fingerprint") or {}).get("gpu") or "")
    links = set(summary.get("graph_types") or []) | set(summary.get("gpu_links") or [])
    if "XGMI" in links:
        # RCCL prints AMD's Infinity Fabric as XGMI where NCCL prints NVL (rccl src/graph/topo.cc
        # topoPathTypeStr): a GPU fabric, not PCIe, and no sourced all_reduce band is on file.
        return Ceiling(None, None, None, f"XGMI between the GPUs of {gpu or 'this node'} (RCCL's topology): no "
                                         "sourced all_reduce band on file for AMD Infinity Fabric")
    nvlink = "NVL" in links
    if not nvlink:
        pci = summary.get("gpu_pci(GB/s)")
        if not pci:
            return Ceiling(None, None, None, "no NVLink between these GPUs, and NCCL's topology dump gave no PCI "
                                             "link rate (NCCL_DEBUG_SUBSYS needs GRAPH)")
        raw = pci * PCIE_RAW_OVER_NCCL
        return Ceiling(raw, None, raw, f"PCIe: NCCL rates the GPUs' slowest link {pci:g} GB/s (topo.cc width x "
                                       f"speed / 80), the wire {raw:.1f} GB/s per direction")
    line = nvlink_rate(gpu)
    if line is None:
        return Ceiling(None, None, None, f"no NVLink rate on file for {gpu or 'this GPU'}")
    return Ceiling(line, FLOOR * EFFECTIVE * line, TOP * line,
                   f"{gpu}: {line:g} GB/s {NVLINK_SOURCE}; floor {FLOOR:g} x NCCL's ~{EFFECTIVE:.0%} effective "
                   f"(nccl-tests#212), top {TOP:g} x line (NVLS ~1.07x, nccl-tests#212/#272)")
