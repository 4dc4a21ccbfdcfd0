"""Pinning readiness from /proc/self/uid_map and the effective uid (fixtures in
tests/fixtures/userns, in the kernel's uid_map format): CAP_IPC_LOCK counts only in the initial
user namespace (capable() is ns_capable(&init_user_ns, ...), kernel/capability.c, asked by
ib_umem_get and can_do_mlock); a non-root user's line names the limit, not the capability.
The real-process check (unshare, mlock) is tests/commands/test_doctor_container.py."""

from __future__ import annotations

import resource

import pytest

from helpers import FIXTURES
from workloads.fabric.readiness import CAP_IPC_LOCK, PIN_MIN, Effective, check_pinning, read_effective

USERNS = FIXTURES / "userns"
ALL_CAPS = (1 << 41) - 1


def eff(mapping: str, euid: int = 0, caps: int = ALL_CAPS, limit: int = 8 << 20, hard: int = 8 << 20) -> Effective:
    uid_map = (USERNS / mapping).read_text()
    return Effective(caps, limit, 1 << 34, uid_map, euid, hard)


def test_read_effective_reads_the_map(tmp_path):
    status = tmp_path / "status"
    status.write_text(f"Name:\tx\nCapEff:\t{1 << CAP_IPC_LOCK:016x}\n")
    e = read_effective(status, tmp_path, USERNS / "rootless_podman.uid_map")
    assert e.ipc_lock and not e.initial_userns and not e.pins_past_limit
    assert read_effective(status, tmp_path, USERNS / "initial.uid_map").pins_past_limit
    assert read_effective(status, tmp_path, tmp_path / "absent").initial_userns   # no userns support: initial


@pytest.mark.parametrize("mapping,shown", [("rootless_podman.uid_map", "0 1000 1 / 1 100000 65536"),
                                           ("pyxis_remap_root.uid_map", "0 1000 1"),
                                           ("docker_userns_remap.uid_map", "0 231072 65536")])
def test_remapped_root_with_every_capability_still_cannot_pin(mapping, shown):
    got = check_pinning(eff(mapping), "fabric=ib")
    assert len(got) == 1 and f"user namespace (uid_map {shown})" in got[0], got
    assert "held here" in got[0] and "(its hard limit is 8 MiB too" in got[0]
    assert "LimitMEMLOCK=infinity" in got[0] and "ulimit -Hl" in got[0]
    assert check_pinning(eff(mapping, limit=resource.RLIM_INFINITY), "fabric=ib") == []
    assert check_pinning(eff(mapping, limit=PIN_MIN), "fabric=ib") == []


def test_a_non_root_user_and_root_in_the_initial_namespace():
    user = check_pinning(eff("enroot_user.uid_map", euid=1000, caps=0), "fabric=ib")
    assert "user namespace (uid_map 1000 1000 1)" in user[0] and "held here" not in user[0]
    plain = check_pinning(eff("initial.uid_map", euid=1000, caps=0), "fabric=ib")
    assert "runs as uid 1000 without CAP_IPC_LOCK" in plain[0] and "ambient" in plain[0]
    assert check_pinning(eff("initial.uid_map"), "fabric=ib") == []                 # rootful root: the cap lifts it
    root = check_pinning(eff("initial.uid_map", caps=0, hard=resource.RLIM_INFINITY), "fabric=ib")
    assert "fix: --cap-add=IPC_LOCK, or --ulimit memlock=-1 where the host's hard limit allows it" in root[0]
    assert "hard limit is" not in root[0]
