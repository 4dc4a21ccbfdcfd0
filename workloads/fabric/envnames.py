r"""The environment variable names fabricbench knows each library reads, so a typo in a
fabric profile (`+fabric.env.GLOO_SOCKET_IFNAM=eth0`) is refused instead of exported and
silently ignored (the run then goes over the default interface).

NCCL: every name an NCCL release reads, from each release's NCCL_PARAM / ncclGetEnv sites
(nccl_versions.tsv, written by tools/nccl_env_table.py; ncclvalues.py says which release reads
which), plus the names PyTorch's ProcessGroupNCCL still reads. RCCL reads the same names.
Gloo: the names in PyTorch's libtorch_cpu.so (`strings ... | grep GLOO_`).
UCX is not listed: it builds its names from per-transport tables and warns about an unused
one itself (UCX_WARN_UNUSED_ENV_VARS, on by default).
"""

def _nccl_names() -> frozenset[str]:
    from workloads.fabric.ncclvalues import table

    return frozenset(table().read)


# Every name some NCCL release from 2.3.7 to 2.30.7 reads (nccl_versions.tsv; which release reads
# which is checked in ncclvalues.py), the names PyTorch's ProcessGroupNCCL reads (c10d's
# ProcessGroupNCCL.cpp: TORCH_NCCL_* and these older spellings), and the SHARP plugin's switch
# (Mellanox/nccl-rdma-sharp-plugins).
NCCL = _nccl_names() | frozenset("""
    NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_DESYNC_DEBUG NCCL_ENABLE_TIMING NCCL_SHARP_DISABLE
""".split())

# nccl-tests reads its own NCCL_TESTS_* names (`git grep '"NCCL_TESTS_' ` in NVIDIA/nccl-tests);
# a fabric profile may set them for collectives.external runs.
NCCL = NCCL | frozenset("""
    NCCL_TESTS_ALLTOALLV_MATRIX_FILE NCCL_TESTS_ALLTOALLV_MATRIX_SCALE NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY
    NCCL_TESTS_ALLTOALLV_SPREAD NCCL_TESTS_DEVICE NCCL_TESTS_MIN_BW NCCL_TESTS_SPLIT NCCL_TESTS_SPLIT_MASK
""".split())

GLOO = frozenset("""
    GLOO_DEVICE_TRANSPORT GLOO_DISABLE_CONNECTION_RETRIES GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER
    GLOO_ENABLE_STORE_V2_API GLOO_LOG_LEVEL GLOO_SOCKET_IFNAME
""".split())

# prefix -> (the library, the names it reads)
KNOWN = {"NCCL_": ("NCCL", NCCL), "GLOO_": ("Gloo", GLOO)}
