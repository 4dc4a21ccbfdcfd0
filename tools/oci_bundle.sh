#!/usr/bin/env bash
# An OCI bundle for `srun --container` (Slurm's OCI support, launch/slurm/oci.conf) from a podman
# image, e.g. make image's localhost/fabricbench:cpu:
#   tools/oci_bundle.sh <image> <bundle dir> [<host dir shared at the same path>...]
#   tools/oci_bundle.sh --remove <bundle dir>
# The rootfs is a podman container's of the image (`podman create` + `podman mount`: the image's
# layers under a layer of its own, in which runc makes the mount points of the shared dirs),
# bind-mounted at <bundle>/rootfs because Slurm 22.05 always points root.path there and runc
# refuses a symlink; runc keeps it read-only, with a tmpfs /tmp. config.json is `runc spec`'s,
# changed where a fabric run needs it: the host's network, processes and host name (below), the
# image's environment and working directory, 4096 open files, a 1 GiB /dev/shm (runc's default is
# 64 MiB, under which NCCL's SHM transport fails; doctor --container flags it), and each listed host
# dir (the checkout, the results) bound read-write at its own path. Root only (mounts).
set -euo pipefail
die() { echo "error: $*" >&2; exit 2; }
if [ "${1:-}" = --remove ]; then
  b="${2:?usage: tools/oci_bundle.sh --remove <bundle dir>}"
  if mountpoint -q "$b/rootfs"; then umount "$b/rootfs"; fi
  if [ -f "$b/container" ]; then podman umount "$(cat "$b/container")" >/dev/null; podman rm "$(cat "$b/container")" >/dev/null; fi
  rm -rf "$b"
  exit 0
fi
[ "$#" -ge 2 ] || die "usage: tools/oci_bundle.sh <image> <bundle dir> [<host dir>...]"
image="$1" b="$2"; shift 2
for t in podman runc python3; do command -v "$t" >/dev/null || die "$t is not installed (apt-get install -y podman runc python3)"; done
podman image exists "$image" || die "no image $image in podman's storage: build it first (make image)"
[ ! -e "$b" ] || die "$b exists: remove it first (tools/oci_bundle.sh --remove $b)"
for d in "$@"; do [ -d "$d" ] || die "$d is not a directory (the host dirs are bound at their own path)"; done
mkdir -p "$b/rootfs"
cid="$(podman create "$image")"
echo "$cid" > "$b/container"
rootfs="$(podman mount "$cid")"
mount --bind "$rootfs" "$b/rootfs"
(cd "$b" && runc spec)
podman image inspect --format '{{json .Config}}' "$image" > "$b/image-config.json"
image_id="$(podman image inspect --format '{{.Id}}' "$image")"
python3 - "$b" "$image_id" "$@" <<'PY'
import json, sys
b, image_id, shared = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = json.load(open(f"{b}/config.json"))
img = json.load(open(f"{b}/image-config.json"))
p = cfg["process"]
p["terminal"] = False
p["env"] = [*(img.get("Env") or p["env"]), f"FABRICBENCH_IMAGE_ID={image_id}"]   # the record's container.image_id
p["cwd"] = img.get("WorkingDir") or "/"
p["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}]
cfg["root"] = {"path": "rootfs", "readonly": True}
lin = cfg["linux"]
# The host's network, process and host-name namespaces, as `docker run --network=host --pid=host`:
# the nodes' addresses are the host's; NCCL tells its processes and hosts apart by pid and host
# name (two containers on one node must not look like one process), and torchrun's rendezvous
# names an agent by address and pid, so two nodes' agents in pid namespaces of their own on one
# address (this project's one-machine Slurm) would be one participant and wait for ever.
lin["namespaces"] = [n for n in lin["namespaces"] if n["type"] not in ("network", "pid", "uts")]
cfg.pop("hostname", None)
mounts = [m for m in cfg["mounts"] if m["destination"] != "/dev/shm"]
mounts.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=1g"]})
mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
for d in shared:
    mounts.append({"destination": d, "type": "bind", "source": d, "options": ["rbind", "rw"]})
cfg["mounts"] = mounts
json.dump(cfg, open(f"{b}/config.json", "w"), indent=1)
PY
rm "$b/image-config.json"
echo "bundle: $b (rootfs: $image); run it: srun --container=$b ..."
