# Shared by the batch files in launch/slurm/ (sourced, never executed). Everything here
# reads Slurm's variables and FB_* settings from the environment; no value is ever
# evaluated as code: each one is a single, quoted word on the command line.
#
# Settings (environment, all optional):
#   FB_HOME            fabricbench checkout on a shared filesystem  [$SLURM_SUBMIT_DIR]
#   FB_PYTHON          python with fabricbench installed   [$FB_HOME/.venv/bin/python, else python3;
#                      inside a container: launch/slurm/python.sh, the image's FB_CLIENT_PYTHON]
#   FB_NPROC_PER_NODE  ranks per node                      [$SLURM_GPUS_ON_NODE, else 1]
#   FB_RDZV_PORT       c10d rendezvous port on the head node [20000 + job id % 20000]
#   FB_CONTAINER_IMAGE run each node's agent in this image with pyxis (srun --container-image)
#   FB_APPTAINER_IMAGE ... or with Apptainer (a .sif file): apptainer exec --nv
#   FB_CONTAINER_MOUNTS extra pyxis mounts (src:dst[,src:dst]); FB_HOME and FB_MODEL_PATH are always mounted
#   MELLANOX_VISIBLE_DEVICES  HCAs enroot exposes in a pyxis container          [all]
#   FB_OCI_BUNDLE      ... or with Slurm's own OCI support: srun --container=<this bundle> (oci.conf
#                      with launch/slurm/oci.conf's runtime lines; tools/oci_bundle.sh makes one)
#   FABRICBENCH_RUN_ID run directory name shared by all nodes  [slurm-$SLURM_JOB_ID]
# Fabric variables (NCCL_*, GLOO_*, UCX_*, ...) set before sbatch reach every rank: srun,
# pyxis and Apptainer (without --cleanenv) pass the whole environment through, and the
# fabric profile chosen with fabric=... exports its own on top (one warning line per exported
# variable it overwrites; a site's values go in conf/local/<fabric>.yaml).

fb_die() { echo "error: $*" >&2; exit 2; }

fb_setup() {
  [ -n "${SLURM_JOB_ID:-}" ] || fb_die "run this file with sbatch (SLURM_JOB_ID is not set)"
  FB_HOME="${FB_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
  [ -f "$FB_HOME/launch/train.py" ] || fb_die "FB_HOME=$FB_HOME is not a fabricbench checkout; submit from the repository root or set FB_HOME"
  if [ -n "${FB_CONTAINER_IMAGE:-}${FB_APPTAINER_IMAGE:-}${FB_OCI_BUNDLE:-}" ]; then
    # resolved inside the container: a serving image's python3 is the engine's, without hydra
    FB_PYTHON="${FB_PYTHON:-$FB_HOME/launch/slurm/python.sh}"
  elif [ -z "${FB_PYTHON:-}" ]; then
    if [ -x "$FB_HOME/.venv/bin/python" ]; then FB_PYTHON="$FB_HOME/.venv/bin/python"; else FB_PYTHON=python3; fi
  fi
  FB_NPROC_PER_NODE="${FB_NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}"
  case "$FB_NPROC_PER_NODE" in ''|*[!0-9]*) fb_die "FB_NPROC_PER_NODE=$FB_NPROC_PER_NODE is not a positive integer";; esac
  FB_RDZV_PORT="${FB_RDZV_PORT:-$((20000 + SLURM_JOB_ID % 20000))}"
  FABRICBENCH_RUN_ID="${FABRICBENCH_RUN_ID:-slurm-$SLURM_JOB_ID}"
  # One address per node, in SLURM_NODEID order (the sorted host list). NodeAddr is what
  # slurmd itself is reached at; on most clusters it equals the host name.
  FB_NODE_ADDRS="$(fb_node_addrs)"
  FB_HEAD_ADDR="${FB_NODE_ADDRS%% *}"
  export FB_HOME FB_PYTHON FB_NPROC_PER_NODE FB_RDZV_PORT FABRICBENCH_RUN_ID FB_NODE_ADDRS FB_HEAD_ADDR
  export FB_RDZV_ENDPOINT="$FB_HEAD_ADDR:$FB_RDZV_PORT"
  echo "fabricbench: job $SLURM_JOB_ID, $SLURM_JOB_NUM_NODES node(s) [$FB_NODE_ADDRS], $FB_NPROC_PER_NODE rank(s)/node, rendezvous $FB_RDZV_ENDPOINT, run id $FABRICBENCH_RUN_ID"
}

fb_node_addrs() {
  local node addr out=()
  for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    addr="$(scontrol show node "$node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')"
    out+=("${addr:-$node}")
  done
  echo "${out[*]}"
}

# srun, one task per node, optionally inside a container; "$@" is the command.
# --whole gives the step every CPU the job holds on each node (srun does not read
# SLURM_CPUS_PER_TASK since 22.05, and a step otherwise gets one CPU per task); --cpu-bind=none
# leaves the ranks free to spread over them.
fb_srun_per_node() {
  local srun_args=(--nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1
                   --whole --cpu-bind=none)
  # FB_SRUN_WAIT: seconds srun waits after the first task ends before ending the others
  # (inference.sbatch: node 0's sweep exits 0 while the engine workers would serve forever)
  [ -n "${FB_SRUN_WAIT:-}" ] && srun_args+=(--wait="$FB_SRUN_WAIT")
  if [ -n "${FB_CONTAINER_IMAGE:-}" ]; then
    local mounts="$FB_HOME:$FB_HOME"
    # the serving batch file's model directory lives outside FB_HOME (e.g. /models/...)
    [ -n "${FB_MODEL_PATH:-}" ] && mounts="$mounts,$FB_MODEL_PATH:$FB_MODEL_PATH"
    [ -n "${FB_CONTAINER_MOUNTS:-}" ] && mounts="$mounts,$FB_CONTAINER_MOUNTS"
    # enroot's 99-mellanox hook mounts /dev/infiniband and the verbs providers only when this is
    # set; without them NCCL finds no HCA in the container and silently uses sockets.
    export MELLANOX_VISIBLE_DEVICES="${MELLANOX_VISIBLE_DEVICES:-all}"
    srun "${srun_args[@]}" --container-image="$FB_CONTAINER_IMAGE" --container-mounts="$mounts" \
      --container-workdir="$FB_HOME" "$@"
  elif [ -n "${FB_OCI_BUNDLE:-}" ]; then
    # The task prolog hands the task's own Slurm variables to oci.conf's RunTimeRun (oci_run.sh):
    # Slurm before 23.02 leaves them out of the container (docs/cluster.md).
    srun "${srun_args[@]}" --container="$FB_OCI_BUNDLE" --task-prolog="$FB_HOME/launch/slurm/oci_task_env.sh" "$@"
  elif [ -n "${FB_APPTAINER_IMAGE:-}" ]; then
    local binds="$FB_HOME"
    [ -n "${FB_MODEL_PATH:-}" ] && binds="$binds,$FB_MODEL_PATH"
    srun "${srun_args[@]}" apptainer exec --nv --bind "$binds" --pwd "$FB_HOME" "$FB_APPTAINER_IMAGE" "$@"
  else
    srun "${srun_args[@]}" "$@"
  fi
}
