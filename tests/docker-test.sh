#!/usr/bin/env bash
# make docker-test: builds the CPU image (docker/Dockerfile) and runs the
# demo with kinfer inside it: tests/demo.sh with every kinfer command (the
# broker, the worker, the smoke clients that check every result against
# the model) run by tests/docker-kinfer.sh in the image, on the host's
# network, with redis-server on the host. Then checks the image: it holds
# no compiler and no test-only package, and its kinfer links only what
# RUNTIME_DEBS installed.
#
# Needs a running Docker engine (Debian's docker.io: dockerd). Where
# debian:12 cannot be pulled, the base is made with debootstrap
# (tools/docker-base.sh) and used for both stages.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${KINFER_IMAGE:-kinfer:cpu}
docker info >/dev/null 2>&1 || { echo "docker-test: no Docker engine answers (start dockerd)" >&2; exit 1; }

base_args=()
if ! docker image inspect debian:12 >/dev/null 2>&1 && ! timeout 60 docker pull -q debian:12 >/dev/null 2>&1; then
  echo "== docker-test: debian:12 cannot be pulled; a debootstrap base instead"
  tools/docker-base.sh kinfer/debian:12
  base_args=(--build-arg BASE=kinfer/debian:12 --build-arg RUNTIME_BASE=kinfer/debian:12)
fi

echo "== docker build -f docker/Dockerfile -t $image ."
t0=$(date +%s)
docker build -q -f docker/Dockerfile "${base_args[@]}" -t "$image" . >/dev/null
echo "   built in $(( $(date +%s) - t0 )) s; $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"

echo "== the image carries the runtime only"
fail=0
for tool in gcc cc make pkg-config redis-server python3 prometheus; do
  if docker run --rm --entrypoint /bin/sh "$image" -c "command -v $tool" >/dev/null 2>&1; then
    echo "   FAIL: $tool is in the image"; fail=1
  fi
done
for pkg in libcmocka0 python3-torch prometheus libopenblas-dev librdkafka-dev; do
  if docker run --rm --entrypoint /usr/bin/dpkg "$image" -s "$pkg" >/dev/null 2>&1; then
    echo "   FAIL: package $pkg is in the image"; fail=1
  fi
done
missing=$(docker run --rm --entrypoint /usr/bin/ldd "$image" /usr/local/bin/kinfer | grep 'not found' || true)
[ -z "$missing" ] || { echo "   FAIL: kinfer misses libraries: $missing"; fail=1; }
docker run --rm "$image" --version
[ "$fail" = 0 ] && echo "   ok: no compiler, no test package, every library found"

echo "== the demo, kinfer in the image (host network, this folder mounted)"
status=0
KINFER_BIN=tests/docker-kinfer.sh KINFER_IMAGE="$image" JOBS=${JOBS:-200} TEXT_JOBS=${TEXT_JOBS:-50} \
  tests/demo.sh || status=$?
[ "$fail" = 0 ] || status=1
if [ "$status" = 0 ]; then echo "docker-test: passed"; else echo "docker-test: FAILED"; fi
exit $status
