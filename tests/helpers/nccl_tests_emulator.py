"""Plays nccl-tests' `all_reduce_perf` and an `mpirun` in front of it, at the one boundary
no CPU machine can cross (the binary needs GPUs), for the part that decides which
communicators it measures. Nothing else of nccl-tests is emulated: the result rows are a
fixed table.

What it reproduces, from NVIDIA/nccl-tests v2.19.6:
- src/common.cu run(): proc = the MPI rank, `color = proc % m` for NCCL_TESTS_SPLIT="MOD m"
  (also "%m"), then MPI_Comm_split(color): the colour is per PROCESS, and every one of its
  `-g` GPUs shares it. Without a launcher there is one process (proc 0), colour 0.
- src/util.cu writeDeviceReport(): rank = proc * nGpus + i (nThreads 1), one line per GPU,
  "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s", gathered to proc 0
  in process order.

    mpirun role: nccl_tests_emulator.py mpirun -np <procs> [-N <per node>] <binary> <args...>
    binary role: nccl_tests_emulator.py perf <args...>   (what the `all_reduce_perf` shim runs)
"""

import os
import sys

ROWS = """\
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
     1048576        262144     float     sum      -1    42.10   24.91   43.59       0    41.80   25.09   43.90       0
     2097152        524288     float     sum      -1    55.00   38.13   66.73       0    54.90   38.20   66.85       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 55.2675
"""


def flag(argv: list[str], name: str, default: str) -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def color(proc: int) -> int:
    split = os.environ.get("NCCL_TESTS_SPLIT", "").replace(" ", "")
    for op in ("MOD", "%"):
        if split.upper().startswith(op):
            return proc % int(split[len(op):], 0)
    return 0


def perf(argv: list[str]) -> None:
    if argv[:1] == ["-h"]:
        print("USAGE: all_reduce_perf [-g,--ngpus <GPUs per thread>] ...")
        return
    procs, per_node = int(os.environ.get("FAKE_MPI_NPROCS", "1")), int(os.environ.get("FAKE_MPI_PER_NODE", "0"))
    gpus = int(flag(argv, "-g", "1"))
    with open(os.environ["FAKE_NCCL_TESTS_ARGV"], "a") as f:
        f.write(" ".join(argv) + "\n")
    print(f"# Collective test starting: all_reduce_perf\n# nThread 1 nGpus {gpus}\n#\n# Using devices")
    for proc in range(procs):
        node, local = (proc // per_node, proc % per_node) if per_node else (0, proc)
        for i in range(gpus):
            print(f"#  Rank {proc * gpus + i:2d} Group {color(proc):2d} Pid {1000 + proc:6d} on {'node' + str(node):>10} "
                  f"device {local * gpus + i:2d} [0000:{0x18 + i:02x}:00] NVIDIA H100 80GB HBM3")
    print("#")
    print(ROWS, end="")


def mpirun(argv: list[str]) -> None:
    os.environ["FAKE_MPI_NPROCS"] = flag(argv, "-np", "1")
    os.environ["FAKE_MPI_PER_NODE"] = flag(argv, "-N", "0")
    rest = argv[:]
    for name in ("-np", "-N"):
        if name in rest:
            i = rest.index(name)
            del rest[i:i + 2]
    os.execvp(rest[0], rest)


if __name__ == "__main__":
    {"perf": perf, "mpirun": mpirun}[sys.argv[1]](sys.argv[2:])
