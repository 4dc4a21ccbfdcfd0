"""Collective micro-benchmarks with nccl-tests' meaning, and OSU-style point-to-point.

ops.py (one object per collective), sweep.py (pure settings/sizes/patterns),
harness.py (timing, checking, printing), p2p.py, nccltests.py (external binaries),
runner.py (the workload: fabric, init, record).
"""
