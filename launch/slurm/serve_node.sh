#!/usr/bin/env bash
# One inference engine process on this node (srun starts one per node; see inference.sbatch).
# Every node composes the same config from the same overrides: node 0 runs launch/infer.py
# (it starts the engine's head and runs the load sweep against it), the others run
# `python -m workloads.inference.worker`, which asks the same adapter for the worker's command
# (server.extra_args, server.env and the served name included) and starts it under the fabric
# profile with NCCL's per-process log. "$@" are Hydra overrides for launch/infer.py.
set -euo pipefail
: "${FB_ENGINE:?}" "${FB_MODEL_PATH:?}" "${FB_TP:?}" "${FB_DIST_ADDR:?}" "${FB_SERVE_PORT:?}"
rank="${SLURM_NODEID:?run under srun}"
read -r -a addrs <<<"$FB_NODE_ADDRS"
server=("server=$FB_ENGINE" "server.tp=$FB_TP" "server.nnodes=$SLURM_JOB_NUM_NODES" "server.node_rank=$rank"
        "server.dist_init_addr=$FB_DIST_ADDR" "server.host=${addrs[$rank]}" "server.port=$FB_SERVE_PORT"
        "server.model_path=$FB_MODEL_PATH")
# vllm-pd: node 0's proxy finds node 1's decode instance there
[ "$FB_ENGINE" = vllm-pd ] && server+=("server.decode_host=${addrs[1]}")
# FB_PYTHON: fabricbench's interpreter (lib.sh; in a container launch/slurm/python.sh, which
# picks the image's fabricbench venv, never the engine's python3)
if [ "$rank" = 0 ]; then
  exec "$FB_PYTHON" "$FB_HOME/launch/infer.py" "${server[@]}" "$@"
fi
PYTHONPATH="$FB_HOME${PYTHONPATH:+:$PYTHONPATH}" exec "$FB_PYTHON" -m workloads.inference.worker "${server[@]}" "$@"
