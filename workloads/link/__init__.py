"""Raw-link baselines: iperf3 TCP throughput and perftest RDMA bandwidth/latency between two nodes.

tools.py (one object per tool: its server and client command lines, the parser of its output),
run.py (the workload: fabric, init, server on rank 0, client on rank 1, record).
"""
