#!/bin/sh
# srun --task-prolog for `srun --container` (lib.sh, FB_OCI_BUNDLE). Slurm runs a task prolog with
# the task's own environment, after the per-task variables are set and before the OCI runtime
# starts; Slurm before 23.02 writes the container's environment earlier, once per step, without
# them. This saves the task's Slurm variables where oci_run.sh (the RunTimeRun of
# launch/slurm/oci.conf, run next by the same task) finds them. Prints nothing: a task prolog's
# stdout is read by slurmstepd as commands (export/unset/print).
set -eu
dir="${FB_OCI_TASK_ENV_DIR:-/tmp}/fabricbench-oci-$(id -u)"
mkdir -p "$dir"
chmod 700 "$dir"
f="$dir/$SLURM_JOB_ID.$SLURM_STEP_ID.$SLURMD_NODENAME.$SLURM_LOCALID.env"
# NUL-separated: a value may hold a newline.
env -0 | grep -z -E '^(SLURM_|SLURMD_)' > "$f.part" || true
mv "$f.part" "$f"
