"""Inference benchmark entry point: start a server, sweep load points, one record per point.

    python launch/infer.py                                    # reference engine, CPU, loopback
    python launch/infer.py server=reference server.tp=2 load.points=[1,2,4] run_id=ref-tp2
    python launch/infer.py server=sglang model=llama-3.1-8b fabric=roce load=concurrency_sweep server.tp=8
    python launch/infer.py server=vllm model=llama-3.1-8b fabric=ib load=rate_sweep server.tp=8
    python launch/infer.py server=external server.url=http://10.0.0.5:30000 model=llama-3.1-8b

A plain process (the load generator is asyncio, one process); the server runs as a child
process group that is always stopped. Rerun with the same run_id= to resume a sweep at
its first missing point. The work lives in workloads/loadgen/sweep.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from workloads.errors import UsageError  # noqa: E402
from workloads.rundir import register_resolvers  # noqa: E402

register_resolvers()
CONF = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(config_path=CONF, config_name="infer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from workloads.loadgen.sweep import run_sweep

    try:
        code = run_sweep(cfg, overrides=list(HydraConfig.get().overrides.task))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted: the server was stopped; finished points are kept", file=sys.stderr, flush=True)
        sys.exit(130)
    sys.exit(code)


if __name__ == "__main__":
    main()
