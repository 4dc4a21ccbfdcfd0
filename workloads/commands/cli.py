"""`fabricbench <command> ...`: a registry of subcommands.

A command is a module with `add_arguments(parser)` and `run(args) -> int`; registering
one is one line in COMMANDS: its module and the one-line purpose `fabricbench --help` shows. Modules are imported only when their command runs, so
`fabricbench doctor` does not pay for what `compare` imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workloads.core.errors import UsageError, say

COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("workloads.commands.doctor", "fabric inventory of this machine, and a profile checked against it"),
    "compare": ("workloads.commands.compare", "fabrics point by point: verdicts with 95% intervals"),
    "report": ("workloads.commands.report", "Markdown + self-contained HTML: verdicts, capacity, plots"),
    "emulate": ("workloads.commands.emulate", "a workload across emulated nodes: namespaces, shaped links, a leaf-spine, noise (root)"),
    "sensitivity": ("workloads.commands.sensitivity", "per workload, time per ms of delay and per 1/bandwidth, with intervals"),
    "model": ("workloads.commands.model", "calibrate a latency-bandwidth model from collectives; project it to scale with 90% PIs"),
    "certify": ("workloads.commands.certify", "a fabric certificate: the IETF BMWG AI-fabric KPIs with intervals, references, verdicts"),
    "study": ("workloads.commands.study", "arms x workloads x blocks, interleaved; then compare and report"),
    "mlperf": ("workloads.commands.mlperf", "MLPerf Training/Inference result logs of two systems: MLPerf's scores, ratio, verdict"),
    "tune": ("workloads.commands.tune", "an arm's settings searched, then the winner confirmed against the default"),
    "gpu-check": ("workloads.commands.gpu_check", "the GPU acceptance check: real workloads on NCCL, one table (make gpu-check)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="fabricbench", description="What does this interconnect do to my AI workloads?")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    for name, (_, purpose) in COMMANDS.items():
        sub.add_parser(name, add_help=False, help=purpose.replace("%", "%%"))  # argparse %-formats help
    # Parse the command name first, then let only that module build its parser.
    name = argv[0] if argv and argv[0] in COMMANDS else None
    if name is None:
        parser.parse_args(argv)  # prints usage (or help) and exits 2
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    cmd = argparse.ArgumentParser(prog=f"fabricbench {name}", description=(module.__doc__ or "").strip().splitlines()[0])
    module.add_arguments(cmd)
    args = cmd.parse_args(argv[1:])
    try:
        return int(module.run(args) or 0)
    except UsageError as e:
        return say(e)


if __name__ == "__main__":
    sys.exit(main())
