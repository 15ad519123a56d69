#!/usr/bin/env bash
# Builds a Prometheus image from Debian's `prometheus` package on the local Debian base, for
# machines that cannot pull prom/prometheus. Same entrypoint and config path as the official
# image (/bin/prometheus, /etc/prometheus/prometheus.yml, data in /prometheus).
#   prometheus-image.sh [TAG]      (default localhost/cpu-llm-service-prometheus:debian)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tag="${1:-localhost/cpu-llm-service-prometheus:debian}"
# shellcheck source=scripts/container/env.sh
. "${here}/env.sh"
if [ -z "${FORCE:-}" ] && podman image exists "${tag}"; then echo "${tag} already present"; exit 0; fi
"${here}/base-image.sh"
ctx="$(mktemp -d)"; trap 'rm -rf "${ctx}"' EXIT
cat > "${ctx}/Containerfile" <<'CF'
FROM docker.io/library/debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/* \
 && { [ -e /bin/prometheus ] || ln -s /usr/bin/prometheus /bin/prometheus; } \
 && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER nobody
EXPOSE 9090
VOLUME ["/prometheus"]
WORKDIR /prometheus
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
CF
buildah bud --pull=never --layers --force-rm --format docker -t "${tag}" "${ctx}"
