"""Fabric profiles from conf/fabric/ and the per-rank transport evidence NCCL's logs give
(tests/fixtures/nccl_logs/, written from NCCL's and RCCL's own format strings)."""

from __future__ import annotations

import yaml

from helpers import FIXTURES, REPO
from workloads.fabric import nccl_log
from workloads.fabric.profile import FabricProfile

NCCL_LOGS = FIXTURES / "nccl_logs"
FABRIC_CONF = REPO / "conf" / "fabric"


def profile(name: str, **expect) -> FabricProfile:
    """conf/fabric/<name>.yaml with `expect` keys replaced."""
    cfg = yaml.safe_load((FABRIC_CONF / f"{name}.yaml").read_text())
    cfg["expect"] = {**cfg["expect"], **expect}
    return FabricProfile.from_config(cfg)


def evidence(case: str) -> list[dict]:
    """Per-rank evidence as each rank would send it (ordered by the rank NCCL logged)."""
    logs = sorted(nccl_log.parse_dir(NCCL_LOGS / case), key=lambda lg: lg.rank if lg.rank is not None else 0)
    return [{"kind": "nccl", "log": lg.as_dict()} for lg in logs]
