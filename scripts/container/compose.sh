#!/usr/bin/env bash
# `make up` / `make down`: the compose stack with a Docker engine (docker compose) or, where no
# daemon runs, with podman-compose on the private storage of env.sh.
#   compose.sh up|down [extra compose args...]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
cd "${repo}"
action="${1:?usage: compose.sh up|down}"; shift || true
engine="${CONTAINER_ENGINE:-}"
if [ -z "${engine}" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker; else engine=podman; fi
fi

# The API key secret: create a random one on first `up` (readable by the container's user).
key_file="${API_KEY_FILE:-./secrets/api_key}"
if [ "${action}" = up ] && [ ! -s "${key_file}" ]; then
  mkdir -p "$(dirname "${key_file}")"; chmod 700 "$(dirname "${key_file}")"
  python3 -c "import secrets; print(secrets.token_urlsafe(32))" > "${key_file}"
  chmod 644 "${key_file}"
  echo "created API key in ${key_file}"
fi

if [ "${engine}" = docker ]; then
  case "${action}" in
    up) exec docker compose up -d --build "$@" ;;
    down) exec docker compose down "$@" ;;
  esac
fi

# podman: build what cannot be pulled here, then podman-compose.
# shellcheck source=scripts/container/env.sh
. "${here}/env.sh"
pc="$(dirname "$(command -v python3)")/podman-compose"
[ -x "${repo}/.venv/bin/podman-compose" ] && pc="${repo}/.venv/bin/podman-compose"
if [ "${action}" = up ]; then
  target="${SERVICE_TARGET:-$(sed -n 's/^SERVICE_TARGET=//p' .env 2>/dev/null | tail -1)}"
  # compose.yaml's default: the image that picks the CPU's backend at start.
  target="${target:-$(sed -n 's/.*target: \${SERVICE_TARGET:-\([^}]*\)}.*/\1/p' compose.yaml | head -1)}"
  image="${SERVICE_IMAGE:-cpu-llm-service}"
  "${here}/build.sh" "${target}" "localhost/${image}"
  if [ -z "${PROMETHEUS_IMAGE:-}" ] && ! podman image exists prom/prometheus:v2.53.0 \
     && ! podman pull -q prom/prometheus:v2.53.0 >/dev/null 2>&1; then
    "${here}/prometheus-image.sh"
    export PROMETHEUS_IMAGE=localhost/cpu-llm-service-prometheus:debian
  fi
  export SERVICE_TARGET="${target}"
  exec "${pc}" -f compose.yaml up -d "$@"
else
  exec "${pc}" -f compose.yaml down "$@"
fi
