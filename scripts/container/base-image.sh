#!/usr/bin/env bash
# Builds the image that Dockerfile.cpu's default BASE_IMAGE (debian:bookworm-slim) names, from
# Debian's archive with mmdebstrap, for machines that cannot pull from a registry.
# The result trusts the host's CA bundle (for pip behind a TLS-inspecting proxy).
# Idempotent: does nothing when the image exists (FORCE=1 rebuilds).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/container/env.sh
. "${here}/env.sh"

SUITE="${SUITE:-bookworm}"
RAW="localhost/debian-raw:${SUITE}"
TAG="${BASE_TAG:-docker.io/library/debian:${SUITE}-slim}"

if [ -z "${FORCE:-}" ] && podman image exists "${TAG}"; then
  echo "base image ${TAG} already present"; exit 0
fi

# Same mirror as the host's apt sources (deb822 first, then the one-line format).
mirror="${DEBIAN_MIRROR:-}"
if [ -z "${mirror}" ]; then
  mirror="$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
fi
if [ -z "${mirror}" ]; then
  mirror="$(awk '$1=="deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"
mirror="${mirror%/}"
security="${DEBIAN_SECURITY_MIRROR:-${mirror%/debian}/debian-security}"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
if [ -n "${FORCE:-}" ] || ! podman image exists "${RAW}"; then
  echo "mmdebstrap ${SUITE} from ${mirror}"
  mmdebstrap --variant=minbase "${SUITE}" "${work}/base.tar" \
    "deb ${mirror} ${SUITE} main" \
    "deb ${mirror} ${SUITE}-updates main" \
    "deb ${security} ${SUITE}-security main"
  podman import --change 'CMD ["/bin/bash"]' "${work}/base.tar" "${RAW}"
  rm -f "${work}/base.tar"
fi

ca="${HOST_CA_BUNDLE:-}"
for c in "${ca}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
  if [ -n "${c}" ] && [ -f "${c}" ]; then ca="${c}"; break; fi
done
mkdir -p "${work}/ctx"
cp "${ca}" "${work}/ctx/ca-bundle.pem"
printf '[global]\ncert = /etc/ssl/ca-bundle.pem\n' > "${work}/ctx/pip.conf"
cat > "${work}/ctx/Containerfile" <<CF
FROM ${RAW}
COPY ca-bundle.pem /etc/ssl/ca-bundle.pem
COPY pip.conf /etc/pip.conf
CF
buildah bud --pull=never --layers --force-rm --format docker -t "${TAG}" "${work}/ctx"
podman image ls
