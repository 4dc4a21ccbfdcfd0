#!/usr/bin/env bash
# One inference engine process on this node (srun starts one per node; see inference.sbatch).
# Node 0: launch/infer.py with the multi-node server settings (it starts the engine's head
# and runs the load sweep against it). Other nodes: the engine's worker, the same flags the
# adapters in workloads/inference/adapters/ give it. "$@" are Hydra overrides for launch/infer.py.
set -euo pipefail
: "${FB_ENGINE:?}" "${FB_MODEL_PATH:?}" "${FB_TP:?}" "${FB_DIST_ADDR:?}" "${FB_SERVE_PORT:?}"
rank="${SLURM_NODEID:?run under srun}"
nnodes="$SLURM_JOB_NUM_NODES"
read -r -a addrs <<<"$FB_NODE_ADDRS"
if [ "$rank" = 0 ]; then
  exec "$FB_PYTHON" "$FB_HOME/launch/infer.py" "server=$FB_ENGINE" "server.tp=$FB_TP" \
    "server.nnodes=$nnodes" "server.node_rank=0" "server.dist_init_addr=$FB_DIST_ADDR" \
    "server.host=${addrs[0]}" "server.port=$FB_SERVE_PORT" "server.model_path=$FB_MODEL_PATH" "$@"
fi
# The workers get the fabric profile and NCCL's per-process log (under the same run directory)
# exactly as node 0's launch/infer.py applies them: re-run this script under it once.
if [ -z "${FB_FABRIC_APPLIED:-}" ]; then
  export FB_FABRIC_APPLIED=1
  PYTHONPATH="$FB_HOME${PYTHONPATH:+:$PYTHONPATH}" exec "$FB_PYTHON" -m workloads.fabric.profile exec "$@" -- bash "$0" "$@"
fi
engine_python="${FB_ENGINE_PYTHON:-python3}"   # the image's Python, where the engine lives
case "$FB_ENGINE" in
  sglang)
    exec "$engine_python" -m sglang.launch_server --model-path "$FB_MODEL_PATH" --tp-size "$FB_TP" \
      --nnodes "$nnodes" --node-rank "$rank" --dist-init-addr "$FB_DIST_ADDR" \
      --host "${addrs[$rank]}" --port "$FB_SERVE_PORT" ;;
  vllm)
    exec vllm serve "$FB_MODEL_PATH" --tensor-parallel-size "$FB_TP" --nnodes "$nnodes" --node-rank "$rank" \
      --master-addr "${FB_DIST_ADDR%:*}" --master-port "${FB_DIST_ADDR##*:}" --headless ;;
esac
