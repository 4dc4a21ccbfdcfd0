"""`fabricbench doctor --container`: real processes started the way container runtimes start
them (a memlock limit set with prlimit, CAP_IPC_LOCK dropped with setpriv, a small /dev/shm
tmpfs in a private mount namespace, verbs device nodes present or not), each reported in one
line that names the fix; a correct setup passes. The HCAs come from the RoCE sysfs fixture and
their device nodes from a folder with real character devices (mknod), since this machine has
no RDMA hardware.

What a runtime gives by default, and what the fixes are: Docker's `--ulimit memlock`,
`--cap-add=IPC_LOCK`, `--shm-size` (default 64 MB) and `--device` (docker run reference);
Kubernetes: `securityContext.capabilities.add: [IPC_LOCK]`, an RDMA device-plugin resource
(k8s-rdma-shared-dev-plugin's `rdma/rdma_shared_device_a`) and an `emptyDir` of
`medium: Memory` at /dev/shm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FIXTURES

EXE = Path(sys.executable).parent / "fabricbench"
ROCE = FIXTURES / "sysfs" / "roce_host"   # mlx5_0 and mlx5_1, verbs devices uverbs0 and uverbs1
UVERBS_MAJOR = 231                        # <rdma/ib_user_verbs.h>: IB_UVERBS_MAJOR; minors from 192
NO_IPC_LOCK = ["setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]

pytestmark = pytest.mark.requires("root", "ibverbs")


def memlock(n: int) -> list[str]:
    return ["prlimit", f"--memlock={n}:{n}"]


def small_shm(size: str) -> list[str]:
    """The command after it runs with a /dev/shm of `size`, in its own mount namespace only."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"', "sh"]


@pytest.fixture
def dev(tmp_path) -> Path:
    """A /dev with both HCAs' verbs character devices (what --device=/dev/infiniband gives)."""
    root = tmp_path / "dev"
    (root / "infiniband").mkdir(parents=True)
    for i in (0, 1):
        os.mknod(root / "infiniband" / f"uverbs{i}", 0o600 | 0o020000, os.makedev(UVERBS_MAJOR, 192 + i))
    return root


def doctor(dev: Path, *, wrap: list[str] = (), fabric: str = "roce", env: dict | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "UCX_"))}
    cmd = [*wrap, str(EXE), "doctor", "--container", "--sysfs-root", str(ROCE), "--dev-root", str(dev),
           f"fabric={fabric}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=environ | (env or {}))
    fails = [line.strip()[len("FAIL: "):] for line in p.stdout.splitlines() if line.strip().startswith("FAIL: ")]
    return p, fails


def test_correct_container_passes(dev):
    # root here holds CAP_IPC_LOCK, /dev/shm is the host's, libibverbs loads, both nodes exist
    p, fails = doctor(dev)
    assert p.returncode == 0 and not fails, p.stdout + p.stderr
    assert "OK: everything the profile names is present and up, and this container lets NCCL use it" in p.stdout


@pytest.mark.parametrize("limit, shown", [(64 << 10, "64 KiB"), (8 << 20, "8 MiB")])
def test_low_memlock_without_ipc_lock_is_one_line(dev, limit, shown):
    """A runtime's default: memlock of 64 KiB or 8 MiB, and no CAP_IPC_LOCK."""
    p, fails = doctor(dev, wrap=[*memlock(limit), *NO_IPC_LOCK])
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert f"may pin only {shown}" in fails[0] and "CAP_IPC_LOCK" in fails[0]
    assert "fix: --cap-add=IPC_LOCK, or --ulimit memlock=-1 where the host's hard limit allows it" in fails[0]


# mlock(2) of 1 MiB: the kernel's own answer to "may this process pin past RLIMIT_MEMLOCK?",
# the same capable(CAP_IPC_LOCK) test as ib_umem_get (mm/mlock.c, drivers/infiniband/core/umem.c)
MLOCK = ("import ctypes, mmap\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "buf = mmap.mmap(-1, 1 << 20)\n"
         "r = libc.mlock(ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(buf))), ctypes.c_size_t(1 << 20))\n"
         "print('pinned' if r == 0 else f'errno {ctypes.get_errno()}')\n")
USERNS = ["unshare", "--user", "--map-root-user"]   # root inside, uid_map "0 0 1": a child user namespace


def kernel_pins(wrap: list[str]) -> str:
    return subprocess.run([*wrap, sys.executable, "-c", MLOCK], capture_output=True, text=True, timeout=60).stdout.strip()


def test_in_a_user_namespace_ipc_lock_does_not_lift_memlock_and_doctor_says_so(dev):
    """Root in a child user namespace holds every capability, CAP_IPC_LOCK included, yet the
    kernel refuses to pin past the limit (ENOMEM, 12): doctor's verdict is the kernel's. The
    same limit in the initial namespace pins (the control)."""
    low = memlock(64 << 10)
    assert kernel_pins(low) == "pinned"
    assert kernel_pins([*low, *USERNS]) == "errno 12"
    p, fails = doctor(dev, wrap=[*low, *USERNS])
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert "it runs in a user namespace (uid_map 0 0 1), where CAP_IPC_LOCK (held here, the namespace's)" in fails[0]
    assert "PropagateResourceLimitsExcept=MEMLOCK" in fails[0] and "rootless podman/docker --ulimit memlock=-1" in fails[0]
    # there only the limit counts: 1 MiB under a 4 MiB limit pins (raising it past this host's
    # hard limit needs CAP_SYS_RESOURCE, which this machine's root lacks)
    assert kernel_pins([*memlock(4 << 20), *USERNS]) == "pinned"


def test_ipc_lock_lifts_the_memlock_limit(dev):
    """The kernel does not apply RLIMIT_MEMLOCK to a holder of CAP_IPC_LOCK (ib_umem_get, mlock):
    a low limit alone is no problem, so no line."""
    p, fails = doctor(dev, wrap=memlock(64 << 10))
    assert p.returncode == 0 and not fails, p.stdout + p.stderr


def test_small_dev_shm_is_one_line(dev):
    p, fails = doctor(dev, wrap=small_shm("4m"))
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert fails[0].startswith("/dev/shm is 4 MiB: NCCL's SHM transport") and "--shm-size=16g" in fails[0]


def test_missing_verbs_devices(dev):
    """No --device=/dev/infiniband: NCCL sees no HCA and takes sockets; one missing HCA of two
    (or a plain file where the device should be) leaves NCCL on fewer NICs."""
    (dev / "infiniband" / "uverbs1").unlink()
    (dev / "infiniband" / "uverbs1").write_text("")
    p, fails = doctor(dev)
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert "selects mlx5_1" in fails[0] and "runs on the other HCAs only" in fails[0]
    for n in (dev / "infiniband").iterdir():
        n.unlink()
    p, fails = doctor(dev)
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert "selects mlx5_0" in fails[0] and "mlx5_1" in fails[0] and "silently uses NET/Socket" in fails[0]
    assert "fix: --device=/dev/infiniband" in fails[0]


def test_net_plugin_that_does_not_load(dev):
    p, fails = doctor(dev, env={"NCCL_NET_PLUGIN": "fabricbench-absent"})
    assert p.returncode == 1 and len(fails) == 1, p.stdout + p.stderr
    assert fails[0].startswith("NCCL_NET_PLUGIN=fabricbench-absent: libnccl-net-fabricbench-absent.so does not load")


def test_all_problems_at_once_and_a_gloo_profile_needs_none(dev):
    """The Docker default (64 KiB, no IPC_LOCK, small shm, no devices) is three lines for RoCE,
    and nothing for a Gloo/TCP profile, which needs none of these settings."""
    for n in (dev / "infiniband").iterdir():
        n.unlink()
    wrap = [*memlock(64 << 10), *NO_IPC_LOCK, *small_shm("64m")]
    p, fails = doctor(dev, wrap=wrap)
    assert p.returncode == 1 and len(fails) == 3, p.stdout + p.stderr
    p, fails = doctor(dev, wrap=wrap, fabric="loopback")
    assert p.returncode == 0 and not fails, p.stdout + p.stderr


def test_container_needs_a_profile():
    p = subprocess.run([str(EXE), "doctor", "--container"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0, p.stderr
    assert "name one, e.g. fabricbench doctor --container fabric=roce" in p.stderr
