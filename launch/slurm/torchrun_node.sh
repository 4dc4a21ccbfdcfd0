#!/usr/bin/env bash
# One torchrun agent on this node (srun starts one per node; see train.sbatch).
# c10d rendezvous on the first node: that node hosts the store (is_host=1), the others
# join it; the rendezvous id is the job id, so a retried or concurrent job never mixes.
# "$@" is the entry script and its Hydra overrides, passed through as words.
set -euo pipefail
: "${FB_RDZV_ENDPOINT:?set by lib.sh fb_setup}" "${FB_PYTHON:?}" "${FB_NPROC_PER_NODE:?}"
node_id="${SLURM_NODEID:?run under srun}"
read -r -a addrs <<<"$FB_NODE_ADDRS"
is_host=0
[ "$node_id" = 0 ] && is_host=1
exec "$FB_PYTHON" -m torch.distributed.run \
  --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node="$FB_NPROC_PER_NODE" \
  --rdzv_backend=c10d --rdzv_endpoint="$FB_RDZV_ENDPOINT" --rdzv_id="$SLURM_JOB_ID" \
  --rdzv_conf="is_host=$is_host" --local_addr="${addrs[$node_id]}" \
  --max_restarts=0 "$@"
