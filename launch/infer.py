"""Inference benchmark entry point: start a server, sweep load points, one record per point.

    python launch/infer.py                                    # reference engine, CPU, loopback
    python launch/infer.py server=reference server.tp=2 load.points=[1,2,4] run_id=ref-tp2
    python launch/infer.py server=sglang model=llama-3.1-8b fabric=roce load=concurrency_sweep server.tp=8
    python launch/infer.py server=vllm model=llama-3.1-8b fabric=ib load=rate_sweep server.tp=8
    python launch/infer.py server=external server.url=http://10.0.0.5:30000 model=llama-3.1-8b

A plain process (the load generator is asyncio, one process); the server runs as a child
process group that is always stopped. Rerun with the same run_id= to resume a sweep at
its first missing point. The work lives in workloads/inference/run.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.inference.run import run_sweep

    return run_sweep(cfg, overrides=overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run, workload="inference", distributed=False)
