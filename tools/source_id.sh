#!/usr/bin/env bash
# What source a build of this checkout holds: HEAD's tree, and a hash of the uncommitted change
# when there is one (tracked files only, as `COPY . .` sends them less .dockerignore's). tools/image.sh
# labels the image with it; tests/helpers/image.py compares the label with the checkout's.
set -euo pipefail
cd "$(dirname "$0")/.."
id="$(git rev-parse 'HEAD^{tree}')"
if ! git diff --quiet HEAD --; then
  id="$id+$(git diff HEAD -- | sha1sum | cut -c1-12)"
fi
echo "$id"
