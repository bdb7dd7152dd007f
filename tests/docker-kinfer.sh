#!/usr/bin/env bash
# tests/docker-kinfer.sh ARGS... - runs `kinfer ARGS...` in the CPU image
# (KINFER_IMAGE, default kinfer:cpu) as tests/demo.sh would run
# build/kinfer: host networking, this repository mounted at its own path
# and the working directory kept (so worker.cfg and the models under
# models/ are the user's own, mounted as a user would mount theirs), as the
# calling user. Signals reach kinfer (docker run proxies them; --init reaps).
set -euo pipefail
exec docker run --rm --init --network host --user "$(id -u):$(id -g)" \
  -v "$PWD:$PWD" -w "$PWD" "${KINFER_IMAGE:-kinfer:cpu}" "$@"
