"""Collectives settings composed from the real conf/ as the entry point composes them."""

from __future__ import annotations

from omegaconf import OmegaConf

from helpers import REPO
from workloads.collectives.settings import Settings
from workloads.core.config import compose


def settings(*overrides, world=2, env=None):
    cfg = compose(str(REPO / "conf"), ["workload=collectives", *overrides])
    return Settings.from_config(OmegaConf.to_container(cfg.collectives, resolve=True), world, env or {})
