#!/bin/sh
# RunTimeRun of launch/slurm/oci.conf: `runc run` of the bundle slurmstepd generated (%b), after
# adding to its process.env the task's Slurm variables that oci_task_env.sh (the step's task
# prolog) saved. Slurm 22.05 writes that config.json once per step from the step's environment
# (src/slurmd/slurmstepd/container.c, setup_container), so without this the container has no
# SLURM_NODEID/SLURM_PROCID/SLURM_LOCALID/SLURMD_NODENAME; 23.02 writes it per task and this adds
# nothing new. A variable already in process.env is replaced, never duplicated.
#   oci_run.sh <runc root> <container id> <bundle> <job id> <step id> <node name> <task id>
set -eu
[ "$#" = 7 ] || { echo "error: oci_run.sh takes 7 arguments (oci.conf's RunTimeRun), got $#" >&2; exit 2; }
root="$1" id="$2" bundle="$3" job="$4" step="$5" node="$6" task="$7"
envf="${FB_OCI_TASK_ENV_DIR:-/tmp}/fabricbench-oci-$(id -u)/$job.$step.$node.$task.env"
if [ ! -f "$envf" ]; then
  echo "error: $envf is missing: run the step with srun --task-prolog=<checkout>/launch/slurm/oci_task_env.sh (lib.sh does when FB_OCI_BUNDLE is set)" >&2
  exit 2
fi
python3 - "$bundle/config.json" "$envf" <<'PY'
import json, sys
cfg_path, env_path = sys.argv[1], sys.argv[2]
with open(env_path, "rb") as f:
    task = dict(kv.decode().split("=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
with open(cfg_path) as f:
    cfg = json.load(f)
proc = cfg.setdefault("process", {})
kept = [kv for kv in proc.get("env", []) if kv.split("=", 1)[0] not in task]
# `container` says to the process (and to its record's fingerprint) which manager started it, as
# podman and systemd-nspawn do; Slurm's runc sets nothing of its own.
proc["env"] = kept + [f"{k}={v}" for k, v in task.items()] + ([] if any(kv.startswith("container=") for kv in kept)
                                                             else ["container=slurm-runc"])
with open(cfg_path + ".part", "w") as f:
    json.dump(cfg, f, indent=1)
import os
os.replace(cfg_path + ".part", cfg_path)
PY
rm -f "$envf"
exec runc --root="$root" run "$id" --bundle "$bundle"
