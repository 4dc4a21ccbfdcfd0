"""Test doubles and references, for the checkout's tests and benchmarks only: the scripted SSE
server (an engine that answers on a script), the reference engine's parity check and the MoE
layer's. No module of workloads/ or analysis/ imports them, and the wheel leaves them out
(pyproject.toml)."""
