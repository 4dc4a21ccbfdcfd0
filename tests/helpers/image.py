"""The cpu image the container tests run, built by `make image`'s script from this checkout.

.ci/run builds it before `make test` (tagged $FB_IMAGE_TAG, which it exports: on a machine that
keeps its podman storage and base tarball, seconds after a source edit; docs/tests.md). With
FB_BUILD_IMAGE=1 a test builds it itself, tagged for this checkout: from an empty podman storage
and base cache that costs the whole build (docs/cluster.md gives the figures), on a machine that
keeps them only the layers the checkout changed; a failed build fails the test with the script's
one line. Otherwise a test uses the image `make image` left. An image that is missing, or holds
other source than this checkout's (its `org.fabricbench.source` label), is a skip naming
`make image`, and a failure where podman is required (CI=true): a CI run must not quietly test
less. The default tag is this checkout's, so that two checkouts on one machine (CI beside an
engineer's worktree) never run each other's source; the layers below the source are shared.
tools/image.sh takes a lock, so test modules on two xdist workers build it once."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from typing import NoReturn

import pytest

from helpers import REPO, required

DEFAULT_TAG = "localhost/fabricbench:cpu"
# podman flags every run of the image needs here (docs/cluster.md): crun refuses this kernel's
# hybrid cgroups, and podman's default open-file limit exceeds the host's hard limit of 20000.
PODMAN_RUN = ["podman", "--runtime", "runc", "run", "--rm", "--ulimit", "nofile=4096:4096",
              "--ulimit", "nproc=4096:4096"]


def checkout_tag() -> str:
    return f"localhost/fabricbench:cpu-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"


def _exists(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], capture_output=True, timeout=60).returncode == 0


def source_id() -> str:
    return subprocess.run(["bash", str(REPO / "tools" / "source_id.sh")], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _source(tag: str) -> str:
    p = subprocess.run(["podman", "image", "inspect", "--format", '{{index .Labels "org.fabricbench.source"}}', tag],
                       capture_output=True, text=True, timeout=60)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() != "<no value>" else ""


def build_wanted() -> bool:
    return os.environ.get("FB_BUILD_IMAGE", "").lower() in ("1", "true", "yes")


def _stop(reason: str) -> NoReturn:
    """A failure where podman is required (CI=true: a CI machine must not quietly test less),
    else a skip; one line either way."""
    if "podman" in required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def cpu_image() -> str:
    """The tag of a cpu image of this checkout: built now with FB_BUILD_IMAGE=1, else the one
    .ci/run built ($FB_IMAGE_TAG) or `make image` left."""
    wanted = os.environ.get("FB_IMAGE_TAG", "")
    if not build_wanted():
        make = f"IMAGE_TAG={wanted} make image" if wanted else "make image"
        for tag in ([wanted] if wanted else [checkout_tag(), DEFAULT_TAG]):
            if _exists(tag):
                held, here = _source(tag), source_id()
                if held != here:
                    _stop(f"{tag} holds source {held or 'without a label'}, this checkout is {here}: "
                          f"run {make} (seconds after a source edit) or set FB_BUILD_IMAGE=1")
                return tag
        _stop(f"{wanted or DEFAULT_TAG} is not built: run {make} first (docs/cluster.md gives its cost), "
              "or set FB_BUILD_IMAGE=1 to build it here")
    tag = wanted or checkout_tag()
    p = subprocess.run(["bash", str(REPO / "tools" / "image.sh")], cwd=REPO, capture_output=True, text=True,
                       timeout=2400, env=os.environ | {"IMAGE_TAG": tag})
    if p.returncode != 0:
        pytest.fail(f"make image failed: {p.stderr.strip()}", pytrace=False)
    return tag


def record_shape(rec: dict) -> set[str]:
    """A record's keys, flattened, less those a launch decides (Hydra's own config, the
    environment), the NIC rails' names made one (`nic.per_rail.*`: they are the interfaces the
    host has at that moment, and on a shared machine another run's veths come and go): two
    records of one workload made in and out of a container must agree here."""
    from workloads.core.records import flatten

    keys = {k for k in flatten(rec, ".") if not k.startswith(("config.hydra", "env."))}
    return {re.sub(r"^nic\.per_rail\.[^.]+(\.[^.]+)*?\.(?=[^.]+$)", "nic.per_rail.*.", k) for k in keys}


def assert_same_but_container(c: dict, h: dict, runtime: str) -> None:
    """Record `c`, made in a container of `runtime`, has the shape, the software and the fabric
    of record `h`, made without one; its fingerprint's `container` says which was which."""
    assert c["status"] == h["status"] == "ok", (c["status"], c["error"], h["status"], h["error"])
    assert record_shape(c) == record_shape(h), sorted(record_shape(c) ^ record_shape(h))
    assert c["fabric"]["name"] == h["fabric"]["name"]
    assert c["world"] == h["world"]
    same = ("torch", "cuda", "fabricbench", "deepspeed", "transformers", "gpu_count")
    assert {k: c["fingerprint"][k] for k in same} == {k: h["fingerprint"][k] for k in same}
    assert (c["fingerprint"]["container"] or {}).get("runtime", "").startswith(runtime), c["fingerprint"]["container"]
    # (not None: the machine that runs the tests may itself be a container, as CI's is)
    assert c["fingerprint"]["container"] != h["fingerprint"]["container"]
