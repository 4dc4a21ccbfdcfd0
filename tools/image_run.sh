#!/usr/bin/env bash
# Run a command in the cpu image as docs/cluster.md's "run it as a user would" does, from any
# checkout: results/ made first (podman, unlike docker, refuses a -v source that does not exist),
# the host's network, the limits the image's runtime needs, and the image's id for the records
# (FABRICBENCH_IMAGE_ID; the tag and commit are baked in by tools/image.sh).
#   tools/image_run.sh make train ARGS=output_root=/out       (make image-run ARGS="make train")
# IMAGE_TAG (default localhost/fabricbench:cpu), IMAGE_TOOL (podman, else docker), IMAGE_RESULTS
# (the host folder mounted at /out, default results), IMAGE_RUN_FLAGS
# (extra run flags, e.g. "--ulimit memlock=-1"). runc's "error setting rlimit type N" (a limit
# above this host's hard one, which a runtime without CAP_SYS_RESOURCE cannot set) becomes one
# line naming the limit and the flag.
set -uo pipefail
cd "$(dirname "$0")/.."
die() { echo "image-run: $*" >&2; exit 2; }
tag="${IMAGE_TAG:-localhost/fabricbench:cpu}"
tool="${IMAGE_TOOL:-$(command -v podman || command -v docker || true)}"
[ -n "$tool" ] || die "needs podman or docker: apt-get install -y podman runc (or set IMAGE_TOOL)"
[ "$#" -gt 0 ] || die "name the command to run in the image, e.g. tools/image_run.sh make train ARGS=output_root=/out"
id="$("$tool" image inspect --format '{{.Id}}' "$tag" 2>/dev/null)" || die "no image $tag: build it first (make image)"
out="${IMAGE_RESULTS:-results}"
mkdir -p "$out"
flags=(run --rm --network host -v "$(cd "$out" && pwd):/out" -e "FABRICBENCH_IMAGE_ID=$id")
# podman's default limits (nofile 1048576) exceed a hard limit below them, as in containers
# that run this project's CI; 4096 is what the image's builds and runs need.
[ "$(basename "$tool")" = podman ] && flags+=(--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
# shellcheck disable=SC2206  # IMAGE_RUN_FLAGS is a list of words by design
extra=(${IMAGE_RUN_FLAGS:-})
err="$(mktemp)"
trap 'rm -f "$err"' EXIT
"$tool" "${flags[@]}" "${extra[@]}" "$tag" "$@" 2> >(tee "$err" >&2)
rc=$?
wait
# RLIMIT_* numbers of Linux's asm-generic/resource.h (x86, arm64): the flag and the host's limit
type="$(grep -o 'error setting rlimit type [0-9]*' "$err" | head -1 | grep -o '[0-9]*$')"
case "$type" in
  6) die "the runtime could not set RLIMIT_NPROC (runc's \"rlimit type 6\") above this host's hard limit (ulimit -Hu: $(ulimit -Hu)): run with --ulimit nproc=4096:4096 (or at most that limit)" ;;
  7) die "the runtime could not set RLIMIT_NOFILE (runc's \"rlimit type 7\") above this host's hard limit (ulimit -Hn: $(ulimit -Hn)): run with --ulimit nofile=4096:4096 (or at most that limit)" ;;
  8) die "the runtime could not set RLIMIT_MEMLOCK (runc's \"rlimit type 8\") above this host's hard limit (ulimit -Hl: $(ulimit -Hl) KiB): drop --ulimit memlock=-1 here, or raise the host's limit (limits.conf, or the runtime's service LimitMEMLOCK=infinity); root in a rootful container pins with --cap-add=IPC_LOCK instead" ;;
  "") ;;
  *) die "the runtime could not set rlimit type $type above this host's hard limit: lower that --ulimit" ;;
esac
exit "$rc"
