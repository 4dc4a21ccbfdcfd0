#!/usr/bin/env bash
# make image: the Dockerfile's `cuda` target built on a plain Debian base (CUDA_BASE),
# from nothing but a Debian mirror and the package index, so it builds where no container
# registry is reachable:
#   1. the base: `mmdebstrap` of Debian bookworm into $IMAGE_CACHE/bookworm.tar (cached: a CI
#      machine that keeps the folder pays for it once; it took 75-169 s here);
#   2. `import` of that tar as $IMAGE_BASE (again only when the tar is newer than the import);
#   3. `build --target cuda --build-arg CUDA_BASE=$IMAGE_BASE` tagged $IMAGE_TAG.
# podman (with buildah's engine and runc) or docker, whichever is installed ($IMAGE_TOOL
# chooses). Each step logs to $IMAGE_CACHE/<step>.log; a failed step is one line naming the
# command, its exit status, its last log line and the log. Settings (environment):
#   IMAGE_TOOL    podman | docker                       [podman if installed, else docker]
#   IMAGE_CACHE   base tarball, stamps and logs: the machine's, not the checkout's, so that a
#                 fresh checkout (CI's) finds the base made once  [~/.cache/fabricbench-image]
#   IMAGE_BASE    the imported base's name              [localhost/fabricbench-base:bookworm]
#   IMAGE_TAG     the built image's name                [localhost/fabricbench:cpu]
#   DEBIAN_MIRROR                                       [http://deb.debian.org/debian]
#   IMAGE_UV_CACHE the host's uv cache, mounted into the build's RUN steps (podman; empty: none)
#                                                       [`.tools/bin/uv cache dir`]
set -euo pipefail
cd "$(dirname "$0")/.."
cache="${IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fabricbench-image}"
base="${IMAGE_BASE:-localhost/fabricbench-base:bookworm}"
tag="${IMAGE_TAG:-localhost/fabricbench:cpu}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
tool="${IMAGE_TOOL:-$(command -v podman || command -v docker || true)}"
# uv's own answer when the checkout has uv (make sync), else its default place.
uv_cache="${IMAGE_UV_CACHE-$( { [ -x .tools/bin/uv ] && .tools/bin/uv cache dir 2>/dev/null; } || echo "${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}")}"

# What the host lacks is bad input (exit 2); a step that ran and failed is a fault (exit 1), as
# docs/reliability.md's exit codes say.
die() { echo "error: $*" >&2; exit 2; }
stamp() {
  local line
  : >"$1.times"
  while IFS= read -r line; do
    printf '%s\n' "$line"
    case "$line" in "STEP "*|"--> Using cache"*|"COMMIT"*) printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$1.times" ;; esac
  done >"$1.log"
  printf '%s END\n' "$EPOCHREALTIME" >>"$1.times"
}
# Where a podman build's time went, from build.times: each step that ran (not cached) and took
# a second or more, the commit of the image, and how many steps the layer cache answered.
steps() {
  awk '$2 == "STEP"   { n++; name[n] = substr($0, index($0, ": ") + 2, 48); at[n] = $1; if ($4 != "FROM") steps++ }
       $2 == "-->"    { cached[n] = 1; hits++ }
       $2 == "COMMIT" { commit = $1 }
       $2 == "END"    { end = $1 }
       END { for (i = 1; i <= n; i++) { stop = i < n ? at[i + 1] : (commit ? commit : end)
                                        if (!cached[i] && stop - at[i] >= 1) printf "%s %.0f s; ", name[i], stop - at[i] }
             if (commit) printf "commit %.0f s; ", end - commit
             printf "%d of %d steps cached\n", hits, steps }' "$cache/build.times"
}
# run <step> <command...>: the command's output goes to the step's log; a failure is one line.
# The build's step and cache lines also go, stamped with the time, to <step>.times (steps()).
run() {
  local step="$1" rc=0; shift
  { "$@" 2>&1 | stamp "$cache/$step"; } || rc=$?
  if [ "$rc" != 0 ]; then
    local last; last="$(grep -v '^\s*$' "$cache/$step.log" | tail -n 1 | cut -c1-200)"
    echo "error: \`$*\` failed (exit $rc): ${last:-no output}; the whole log: $cache/$step.log" >&2
    exit 1
  fi
}

if [ -n "${IMAGE_TOOL:-}" ] && ! command -v "$IMAGE_TOOL" >/dev/null; then
  die "IMAGE_TOOL=$IMAGE_TOOL: no such program; set IMAGE_TOOL to podman, docker or the path of one, or unset it"
fi
[ -n "$tool" ] && command -v "$tool" >/dev/null \
  || die "make image needs podman or docker: apt-get install -y podman buildah runc (or set IMAGE_TOOL)"
mkdir -p "$cache"
# One build at a time per cache (two test workers, two checkouts of one machine): the second
# waits, then finds every layer the first committed.
exec 9>"$cache/lock"
flock 9
tar="$cache/bookworm.tar"
t0=$SECONDS
if [ ! -s "$tar" ]; then
  command -v mmdebstrap >/dev/null || die "the base $tar is missing and mmdebstrap is not installed: apt-get install -y mmdebstrap"
  hooks=()
  # A site whose HTTPS goes through an inspecting proxy trusts a local CA
  # (/usr/local/share/ca-certificates); the image's ca-certificates folds it in, so that pip
  # and uv inside the build reach the package index as the host does.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    hooks+=(--customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share')
  fi
  run base mmdebstrap --variant=apt --format=tar "${hooks[@]}" bookworm "$tar.part" "$mirror"
  mv "$tar.part" "$tar"
  echo "base: $tar made in $((SECONDS - t0)) s"
else
  echo "base: $tar (cached)"
fi
if [ ! -e "$cache/imported" ] || [ "$tar" -nt "$cache/imported" ] || ! "$tool" image inspect "$base" >/dev/null 2>&1; then
  run import "$tool" import "$tar" "$base"
  touch "$cache/imported"
fi
flags=()
if [ "$(basename "$tool")" = podman ]; then
  # crun refuses a hybrid cgroup hierarchy; runc runs on both. A host whose hard RLIMIT_NOFILE is
  # below podman's default (1048576) fails every RUN step unless the build asks for less.
  command -v runc >/dev/null && flags+=(--runtime runc)
  build=("$tool" "${flags[@]}" build --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --network host)
  # The host's uv cache, mounted for the RUN steps only (a volume is not part of any layer): the
  # image's `uv sync --frozen` resolves the same lock to the wheels `make sync` already fetched,
  # instead of ~4 GB from the package index, and the cache stays out of the image.
  if [ -n "$uv_cache" ] && [ -d "$uv_cache" ]; then
    build+=(--volume "$uv_cache:/root/.cache/uv")
  fi
else
  build=("$tool" build --network host)
fi
# The host's CA settings for pip and uv (set where HTTPS is inspected, as on this project's CI);
# the bundle path is the Debian one, which the image has once ca-certificates is installed.
for v in SSL_CERT_FILE PIP_CERT; do
  [ -n "${!v:-}" ] && build+=(--build-arg "$v=${!v}")
done
t1=$SECONDS
old_id="$("$tool" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
# The source the image holds, as a label: the container tests refuse an image of other source
# (a record made by older code in the container differs from the host's in shape, not in fabric).
source_id="$(tools/source_id.sh)"
# The commit and uncommitted-edit hash the records inside will carry (fingerprint.git_commit's own)
read -r commit dirty_hash < <("${PYTHON:-python3}" -c 'from workloads.core.fingerprint import git_commit as g; c = g()
print(c["commit"] or "", c["dirty_hash"] or "")')
build+=(--label "org.fabricbench.commit=$commit" --build-arg "FB_GIT_COMMIT=$commit"
        --build-arg "FB_GIT_DIRTY_HASH=$dirty_hash" --build-arg "FB_IMAGE=$tag")
run build "${build[@]}" --target cuda --build-arg "CUDA_BASE=$base" --label "org.fabricbench.source=$source_id" -t "$tag" .
# The image this tag named before (CI rebuilds it on every run) would stay as an untagged one,
# its source layers too; the layers it shares with the new one stay. In use by a container: kept.
new_id="$("$tool" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then "$tool" rmi "$old_id" >/dev/null 2>&1 || true; fi
run_flags="${flags[*]:+${flags[*]} }run --rm"
[ "$(basename "$tool")" = podman ] && run_flags="$run_flags --ulimit nofile=4096:4096 --ulimit nproc=4096:4096"
# the image's id, which no file inside can hold (it is the hash of the image itself)
run_flags="$run_flags -e FABRICBENCH_IMAGE_ID=$new_id"
[ -s "$cache/build.times" ] && echo "image: where the time went: $(steps)"
echo "image: $tag built in $((SECONDS - t1)) s ($tool); run it: $tool $run_flags $tag make train"
