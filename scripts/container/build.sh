#!/usr/bin/env bash
# Build one target of Dockerfile.cpu:  scripts/container/build.sh TARGET [IMAGE_REPO]
# Uses docker when a Docker engine answers, otherwise buildah with the private storage of
# env.sh (no daemon, no registry: the base image is built from Debian's archive first).
# Where torch comes from is decided here at run time: when the host's pip configuration lists
# a find-links directory that holds the pinned torch wheel, that directory is mounted into the
# build and no extra index is used; otherwise PyTorch's CPU index (the Dockerfile default).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
target="${1:?usage: build.sh TARGET [IMAGE_REPO]}"
image_repo="${2:-${IMAGE_REPO:-}}"
builder="${CONTAINER_BUILDER:-auto}"
cd "${repo}"

py="$(command -v python3 || command -v python)"
service_version="$("${py}" -c "import tomllib; print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])")"
torch_version="$(sed -n 's/^ARG TORCH_VERSION=//p' Dockerfile.cpu | head -1)"

args=(--build-arg "SERVICE_VERSION=${service_version}")
mounts=()
findlinks=""
for fl in $("${py}" -m pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
  fl="${fl#file://}"
  if [ -d "${fl}" ] && compgen -G "${fl}/torch-${torch_version}-*.whl" >/dev/null; then
    findlinks="${fl}"; break
  fi
done
if [ -n "${findlinks}" ]; then
  echo "torch ${torch_version} from find-links ${findlinks} (mounted at /wheels)"
  args+=(--build-arg TORCH_FIND_LINKS=/wheels --build-arg TORCH_INDEX_URL=)
  mounts+=(-v "${findlinks}:/wheels:ro")
fi
[ -n "${BASE_IMAGE:-}" ] && args+=(--build-arg "BASE_IMAGE=${BASE_IMAGE}")

if [ "${builder}" = auto ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then builder=docker; else builder=buildah; fi
fi
# The name compose.yaml uses (podman stores unqualified local names under localhost/).
if [ -z "${image_repo}" ]; then
  if [ "${builder}" = docker ]; then image_repo=cpu-llm-service; else image_repo=localhost/cpu-llm-service; fi
fi

start=$(date +%s)
if [ "${builder}" = docker ]; then
  if [ -n "${findlinks}" ]; then
    # BuildKit cannot bind a host directory into RUN: pass it as a named build context.
    echo "note: docker builds use PyTorch's CPU index (find-links mounts need buildah)" >&2
    args=(--build-arg "SERVICE_VERSION=${service_version}")
  fi
  docker build -f Dockerfile.cpu --target "${target}" -t "${image_repo}:${target}" "${args[@]}" .
else
  # shellcheck source=scripts/container/env.sh
  . "${here}/env.sh"
  if [ -z "${BASE_IMAGE:-}" ]; then "${here}/base-image.sh"; fi
  buildah bud --pull=never --layers --force-rm --format docker -f Dockerfile.cpu --target "${target}" \
    -t "${image_repo}:${target}" "${mounts[@]}" "${args[@]}" .
fi
echo "built ${image_repo}:${target} in $(( $(date +%s) - start )) s"
