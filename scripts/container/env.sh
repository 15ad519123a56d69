# shellcheck shell=bash
# Source me: points buildah/podman at a private storage and engine configuration in the user's
# cache dir ($XDG_CACHE_HOME/cpu-llm-service-containers; override with CONTAINER_HOME), so layer
# caching carries between runs and between clones (CI) on the same machine, and nothing of the
# host's default container storage is touched. Beside the service's cache dir, not in it: the
# service refuses to start where another user owns anything beneath its cache dir, and image
# layers hold the images' users' files.
#
# Host quirks handled here (see README.md, "Containers"):
#  - crun fails on hybrid cgroups on some hosts -> use runc when it is installed;
#  - podman lowers RLIMIT_NPROC and then fails to raise it -> pin the limits;
#  - healthchecks need systemd timers -> callers poll `podman healthcheck run` instead.
_cl_cache="${XDG_CACHE_HOME:-${HOME}/.cache}"
export CONTAINER_HOME="${CONTAINER_HOME:-${_cl_cache}/cpu-llm-service-containers}"
# A storage left in the service's cache dir by a run before 2026-12-06 moves here, layer cache and all. podman's state
# database names the old path (and then lists no image): it goes, with the containers and volumes it tracked, which
# no run keeps.
if [ -d "${_cl_cache}/cpu-llm-service/containers/storage" ] && [ ! -e "${CONTAINER_HOME}" ]; then
  mv "${_cl_cache}/cpu-llm-service/containers" "${CONTAINER_HOME}"
  rm -f "${CONTAINER_HOME}/storage/libpod/bolt_state.db" "${CONTAINER_HOME}/storage/db.sql"
fi
mkdir -p "${CONTAINER_HOME}/storage" "${CONTAINER_HOME}/run" "${CONTAINER_HOME}/tmp"

_cl_nofile="$(ulimit -Hn)"
[ "${_cl_nofile}" = "unlimited" ] && _cl_nofile=1048576
_cl_runtime=""
if command -v runc >/dev/null 2>&1; then _cl_runtime='runtime="runc"'; fi

cat > "${CONTAINER_HOME}/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "${CONTAINER_HOME}/storage"
runroot = "${CONTAINER_HOME}/run"
CONF
cat > "${CONTAINER_HOME}/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=${_cl_nofile}:${_cl_nofile}", "nproc=32768:32768"]
[engine]
${_cl_runtime}
tmp_dir = "${CONTAINER_HOME}/tmp"
CONF
export CONTAINERS_STORAGE_CONF="${CONTAINER_HOME}/storage.conf"
export CONTAINERS_CONF="${CONTAINER_HOME}/containers.conf"
# buildah keeps its own copy of the engine settings; make sure it sees the same runtime.
if command -v runc >/dev/null 2>&1; then export BUILDAH_RUNTIME="$(command -v runc)"; fi
export BUILDAH_FORMAT=docker   # HEALTHCHECK survives only in the docker image format
unset _cl_cache _cl_nofile _cl_runtime
