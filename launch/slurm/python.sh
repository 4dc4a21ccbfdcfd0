#!/bin/sh
# fabricbench's interpreter inside a container (lib.sh's FB_PYTHON there). It is resolved in
# the container, not on the submit host: in the sglang/vllm images `python3` is the engine's
# interpreter, which has no hydra, and FB_CLIENT_PYTHON (set by every image in the
# Dockerfile) names fabricbench's venv; an image without it falls back to python3.
exec "${FB_CLIENT_PYTHON:-python3}" "$@"
