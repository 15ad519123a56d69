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

# The secrets: the API key and Grafana's admin password, random, created on first `up` (readable by the
# containers' users). An existing file is kept, even an empty one: the service refuses an empty key file, loudly.
secret() {
  local file="$1" what="$2"
  if [ "${action}" = up ] && [ ! -e "${file}" ]; then
    mkdir -p "$(dirname "${file}")"; chmod 700 "$(dirname "${file}")"
    python3 -c "import secrets; print(secrets.token_urlsafe(32))" > "${file}"
    chmod 644 "${file}"
    echo "created ${what} in ${file}"
  fi
}
secret "${API_KEY_FILE:-./secrets/api_key}" "API key"
secret "${GRAFANA_PASSWORD_FILE:-./secrets/grafana_admin_password}" "Grafana's admin password"

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
