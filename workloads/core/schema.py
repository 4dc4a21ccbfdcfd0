"""The type of every numeric and boolean config value, checked once before any work.

Hydra passes `train.micro_batch_size=1.5` as a float and `collectives.iters=abc` as a
string; scattered `int()` calls would truncate the first and raise a traceback for the
second. The keys are the shared ones below and each workload's own, which it declares to
the catalog (workloads/catalog.py). Every workload's opening (`session.prepare`) runs `check(cfg)` first, so a wrong
value is one line that names the key, the value and what it must be. Keys absent from a
config (another workload's section) are skipped; strings such as `collectives.maxbytes=4M`
and enumerations are validated where they are parsed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from workloads import catalog
from workloads.core.errors import UsageError


@dataclass(frozen=True)
class Num:
    """A number: `integer` refuses fractions; `lo`/`hi` bound it (`lo_open`: lo excluded)."""

    integer: bool
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    optional: bool = False
    finite: bool = True       # false: .inf allowed (an open-loop rate of "all at once")

    def describe(self) -> str:
        what = "an integer" if self.integer else "a number"
        if self.lo is not None and self.hi is not None:
            what += f" in [{self.lo:g}, {self.hi:g}]"
        elif self.lo == 0 and self.lo_open:
            what = "a positive " + what.split(" ", 1)[1]
        elif self.lo is not None:
            what += f" {'>' if self.lo_open else '>='} {self.lo:g}"
        return what + (" (or null)" if self.optional else "")

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or (self.finite and math.isinf(v)):
            return False
        if self.integer and v != int(v):
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return self.hi is None or v <= self.hi


@dataclass(frozen=True)
class Flag:
    def describe(self) -> str:
        return "true or false"

    def ok(self, v: Any) -> bool:
        return isinstance(v, bool)


@dataclass(frozen=True)
class Many:
    """A non-empty list whose every item is `item`."""

    item: Num

    def describe(self) -> str:
        return f"a list of {self.item.describe().replace('an integer', 'integers').replace('a ', '')}"

    def ok(self, v: Any) -> bool:
        return isinstance(v, (list, tuple, ListConfig)) and all(self.item.ok(x) for x in v)


COUNT = Num(True, 0, lo_open=True)          # 1, 2, ...
INDEX = Num(True, 0)                        # 0, 1, ...
SECONDS = Num(False, 0, lo_open=True)
OPT_COUNT = Num(True, 0, lo_open=True, optional=True)

# The keys every workload shares; each workload's own keys are declared beside its code
# (KEYS in the module its catalog entry `declares`) and read from the catalog here.
SCHEMA: dict[str, Num | Flag | Many] = {
    "seed": Num(True), "trial": INDEX, "dist.timeout_s": SECONDS, "launcher.nproc_per_node": COUNT,
    "metrics.peak_tflops": Num(False, 0, lo_open=True, optional=True),
}


def _get(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = node[part]
    return True, OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node


def _value(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    """(present, value); an interpolation that does not resolve (train.seq_length of a model
    without one) is left to the workload's own check, which names the real cause."""
    from omegaconf.errors import InterpolationResolutionError

    try:
        return _get(cfg, key)
    except InterpolationResolutionError:
        return False, None


def check(cfg: DictConfig) -> None:
    """Raise one UsageError naming the first value of the wrong type or range."""
    for key, kind in {**SCHEMA, **catalog.keys()}.items():
        present, value = _value(cfg, key)
        if present and not kind.ok(value):
            raise UsageError(f"{key} must be {kind.describe()}, got {value!r}; set {key}= on the command line "
                             "or in its config file")
