#!/usr/bin/env bash
# Builds the project's images from the repository's Dockerfiles with --pull=never (the
# base images are local: scripts/deploy/bases.sh), one at a time. Where pip's config
# names local wheel directories (this CI's CPU torch), they are mounted into the build
# and passed on, so no CUDA build of torch is downloaded. Prints each image's size.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

mounts=() args=()
find_links=${PIP_FIND_LINKS:-$(pip3 config get global.find-links 2>/dev/null || true)}
extra_index=$(pip3 config get global.extra-index-url 2>/dev/null || true)
for dir in $find_links $(echo "$extra_index" | tr ' ' '\n' | sed -n 's|^file://\(/.*\)/simple$|\1|p'); do
  [ -d "$dir" ] && mounts+=(-v "$dir:$dir:ro")
done
# A TLS-inspecting proxy's CA, where pip is told of one.
cert=${PIP_CERT:-$(pip3 config get global.cert 2>/dev/null || true)}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  mounts+=(-v "$cert:/etc/pip-ca.crt:ro")
  args+=(--build-arg PIP_CERT=/etc/pip-ca.crt)
fi
[ -n "$find_links" ] && args+=(--build-arg "PIP_FIND_LINKS=$find_links")
[ -n "$extra_index" ] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=$extra_index")
# A local CPU wheel of torch: install it by its exact version; its dependencies come from PyPI.
torch_args=()
if ls $find_links/torch-*+cpu-*.whl >/dev/null 2>&1; then
  torch_version=$(basename "$(ls $find_links/torch-*+cpu-*.whl | head -1)" | cut -d- -f2)
  torch_args=(--build-arg "TORCH_VERSION=$torch_version" --build-arg TORCH_INDEX_URL=https://pypi.org/simple)
fi

build() {  # IMAGE DOCKERFILE [args...]
  local image=$1 file=$2; shift 2
  local t0=$SECONDS
  echo "build: $image ($file)" >&2
  podman build --pull=never --network host --format docker "${mounts[@]}" "${args[@]}" "$@" \
    -f "$file" -t "$image" . >"${BUILD_LOG_DIR:-/tmp}/build-$(basename "$file" .Dockerfile).log" 2>&1 \
    || { tail -40 "${BUILD_LOG_DIR:-/tmp}/build-$(basename "$file" .Dockerfile).log" >&2; return 1; }
  echo "build: $image in $((SECONDS - t0)) s, $(podman image inspect "$image" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')" >&2
}

images=${*:-coordinator worker-cpu client}
for name in $images; do
  case $name in
    coordinator) build "localhost/torchfarm/coordinator:$VERSION" docker/coordinator.Dockerfile ;;
    worker-cpu) build "localhost/torchfarm/worker-cpu:$VERSION" docker/worker-cpu.Dockerfile "${torch_args[@]}" ;;
    client) build "localhost/torchfarm/client:$VERSION" docker/client.Dockerfile "${torch_args[@]}" ;;
    *) echo "build: unknown image $name" >&2; exit 2 ;;
  esac
done
