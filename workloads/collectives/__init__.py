"""Collective micro-benchmarks with nccl-tests' meaning, and OSU-style point-to-point.

settings.py (the collectives: section as one frozen, nested plan; sizes, patterns), ops.py (one
object per collective), harness.py (timing, checking, printing), stability.py (per-call spread
and stragglers), p2p.py, nccltests.py (external binaries), run.py (the workload: fabric, init,
record).
"""
