"""What an emulated run needs, read from its config before anything is built: the topology
its fabric profile's `emulate:` block asks for (one for every point of a sweep), the config
validated for the world it will run at, and whether a served engine can span the nodes.
The emulate command (workloads/commands/emulate.py) and the study's planner call it; neither
needs root for this part."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from workloads import catalog
from workloads.core.errors import UsageError
from workloads.fabric import delaymeter, faults, noise
from workloads.fabric.netns import IFNAME, EmuSpec

LOOPBACK = "lo"



def spec_from_overrides(conf_dir: str, overrides: Sequence[str], nproc_per_node: int = 1,
                        jobs: int = 1,
                        check_served: Callable[[Mapping[str, Any], int], None] | None = None,
                        **cli: Any) -> tuple[EmuSpec, str]:
    """Compose the Hydra config the entry will see (every point, for a -m sweep such as
    trial=0,1,2,3) and read its fabric's emulate: block; one topology serves them all."""
    from workloads.core.config import compose, expand_sweep, validate_job

    plain = [o for o in overrides if o not in ("-m", "--multirun")]
    points = expand_sweep(plain) if len(plain) < len(overrides) else [plain]
    found = set()
    for point in points:
        cfg = compose(conf_dir, point)
        spec = _spec_of(cfg, cli)
        found.add(spec)
        if catalog.field(str(cfg.workload.name), "served", False):
            _check_served(cfg, spec[0], check_served)
            continue  # the load generator checks the rest itself, before it starts the server
        # The whole config, for the world it will run at, before any namespace exists (whose
        # interface does not exist yet either: lo stands in for it in the host checks).
        with delaymeter.promised():  # the delay line a delay asks for is built with the namespaces
            validate_job(compose(conf_dir, [*point, f"fabric.env.GLOO_SOCKET_IFNAME={LOOPBACK}"]),
                         spec[0].nodes // max(jobs, 1) * nproc_per_node)
    if len(found) > 1:
        raise UsageError(f"the sweep's points need {len(found)} different emulated fabrics, and one emulate run "
                         "builds one topology: sweep fabrics as separate emulate runs")
    return found.pop()


def faults_of(conf_dir: str, overrides: Sequence[str]) -> tuple:
    """The fault schedule of the run's config (its first point: one topology, one schedule)."""
    from omegaconf import OmegaConf

    from workloads.core.config import compose, expand_sweep

    plain = [o for o in overrides if o not in ("-m", "--multirun")]
    point = expand_sweep(plain)[0] if len(plain) < len(overrides) else plain
    block = OmegaConf.to_container(compose(conf_dir, point).fabric, resolve=True).get("emulate") or {}
    return faults.parse(block.get("faults"))


def _spec_of(cfg, cli: Mapping[str, Any]) -> tuple[EmuSpec, str]:
    from omegaconf import OmegaConf

    block = OmegaConf.to_container(cfg.fabric, resolve=True).get("emulate")
    if isinstance(block, dict):  # background traffic is the noise module's (checked there, not a link setting)
        noise.NoiseSpec.from_config(block.pop("noise", None))
        faults.parse(block.pop("faults", None))  # the fault schedule is faults.py's, checked against the topology there
    if block is None:
        raise UsageError(f"fabric={cfg.fabric.name} has no emulate: block; use fabric=emu-100m or fabric=emu-1g "
                         "(or add an emulate: block to your fabric profile)")
    if str(cfg.fabric.get("env", {}).get("GLOO_SOCKET_IFNAME")) != IFNAME:
        given = ", ".join(f"emulate.{k}" for k in sorted(block)) or "an emulate: block"
        raise UsageError(f"fabric={cfg.fabric.name} is not an emulated fabric ({given} given, but its "
                         f"env.GLOO_SOCKET_IFNAME is not {IFNAME}, the emulated link's name); use an emu-* profile "
                         "such as fabric=emu-100m with the same settings")
    return EmuSpec.from_config(block, **cli), str(cfg.fabric.name)


def _check_served(cfg, spec: EmuSpec, check_served: Callable[[Mapping[str, Any], int], None] | None) -> None:
    """Served inference across the namespaces: not on a leaf-spine (its engines' nodes are
    addressed on one flat link), and an engine that can span this many nodes (its adapter says:
    inference/adapters' check_emulated, handed in by the command or the study that plans)."""
    if spec.leaf_spine:
        raise UsageError("served inference does not run on an emulated leaf-spine yet (its engines' nodes are "
                         "addressed on one flat link); use fabric.emulate.topology=null, or a training, "
                         "collectives or link run on the leaf-spine")
    if check_served is not None:
        from omegaconf import OmegaConf

        check_served(OmegaConf.to_container(cfg.server, resolve=True), spec.nodes)
