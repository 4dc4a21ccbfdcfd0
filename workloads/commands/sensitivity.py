"""Sensitivity: how much each workload's time moves per ms of one-way delay and per unit of 1/bandwidth.

    fabricbench sensitivity results/                       # slopes with 95% intervals
    fabricbench sensitivity results/ --delay 100us --rate 400gbit --from-rate 200gbit
                                                           # what +100 us and 200 -> 400 Gbit/s would do

Reads the records of emulated runs that differ in their link's delay (the delay line's achieved
median) and/or rate (fabric.emulate.rate), e.g. a study whose arms sweep `fabric.emulate.latency`
over 0.5, 1, 2, 5 ms and another over rates. Per workload point and time (step, TPOT, TTFT, one
small all_reduce) an ordinary least-squares fit gives the slope against each axis that varied,
with a t interval over the runs (docs/emulation.md says what carries over to a real fabric).
"""

from __future__ import annotations

from workloads.core.errors import UsageError


def add_arguments(ap) -> None:
    ap.add_argument("dirs", nargs="+", help="results folders (records are found below them)")
    ap.add_argument("--delay", help="what if the one-way delay grew by this much, e.g. 100us or 2ms")
    ap.add_argument("--rate", help="what if the link ran at this rate (needs --from-rate), e.g. 400gbit")
    ap.add_argument("--from-rate", help="the rate the what-if starts from, e.g. 200gbit")


def run(args) -> int:
    from pathlib import Path

    from analysis.latency import slope_lines, slopes
    from workloads.core.records import iter_records
    from workloads.fabric.netns import delay_us, rate_bits_per_s

    for d in args.dirs:
        if not Path(d).is_dir():
            raise UsageError(f"{d} is not a folder; give the results folder(s) of emulated runs")
    if (args.rate is None) != (args.from_rate is None):
        raise UsageError("--rate and --from-rate go together: the what-if moves the link from one rate to the other")
    add_ms = delay_us(args.delay, "--delay") / 1e3 if args.delay else 0.0
    add_inv = (1e9 / rate_bits_per_s(args.rate) - 1e9 / rate_bits_per_s(args.from_rate)) if args.rate else 0.0
    recs = [rec for d in args.dirs for _, rec in iter_records(d, "**/records/*.json")]
    if not recs:
        raise UsageError(f"no result records found in {', '.join(args.dirs)}; give the results folder(s) of emulated "
                         "runs (a study's folder or an output_root holding <run>/records/*.json)")
    found = slopes(recs)
    if not found:
        raise UsageError(f"no workload point in {', '.join(args.dirs)} has 3 or more ok runs that differ in their "
                         "emulated link's delay or rate; run a study whose arms sweep fabric.emulate.latency "
                         "(conf/study/emu-latency.yaml) or fabric.emulate.rate")
    for line in slope_lines(found, add_ms, add_inv):
        print(line)
    return 0
