#!/usr/bin/env bash
# `make test` after its set-up:  scripts/test.sh PYTHON PHASES_FILE STARTED_EPOCH
# Lint, then the host's tests (unit, then integration, reliability and any other test directory) in this pytest,
# while the container tests (tests/container: image builds, the compose stack, each image served) run beside them
# in a pytest of their own. An engine start or an image build keeps about one of the two cores busy, so the two
# streams together finish far sooner than one after the other (docs/development.md, "Time budget"). The container
# stream runs its first container only once the unit tests are done: they read the live machine's free memory.
# At the end: the container stream's output, then every phase's time beside its budget (tests/support/phases.py).
set -uo pipefail
py="${1:?usage: test.sh PYTHON PHASES_FILE STARTED_EPOCH}"; phases="${2:?}"; started="${3:?}"
cd "$(dirname "$0")/.."
export TEST_PHASES="${phases}"
unit_done=".cache/test-unit-done"; container_log=".cache/test-container.log"
rm -f "${unit_done}"

TEST_CONTAINERS_AFTER="${unit_done}" "${py}" -m pytest -q --durations=15 --basetemp=.cache/pytest-container \
  -p no:cacheprovider tests/container > "${container_log}" 2>&1 &
containers=$!
echo "the container tests run beside the others: ${container_log}"
stop_containers() { kill -INT "${containers}" 2>/dev/null; wait "${containers}" 2>/dev/null; }

s=$(date +%s)
if ! make --no-print-directory lint; then stop_containers; exit 1; fi
printf 'lint\t%s\n' $(( $(date +%s) - s )) >> "${phases}"

"${py}" -m pytest -q --durations=10 tests/unit; unit=$?
touch "${unit_done}"
host=()
for dir in tests/*/; do
  case "${dir}" in tests/unit/|tests/container/) ;; *) host+=("${dir}") ;; esac
done
"${py}" -m pytest -q --durations=25 "${host[@]}"; rest=$?
wait "${containers}"; container=$?

echo "=== the container tests (${container_log}) ==="
grep -v '^\.*\(s\|x\|F\|E\|\.\)*\s*\[ *[0-9]*%\]$' "${container_log}" | tail -n 60
"${py}" -m tests.support.phases "${phases}" $(( $(date +%s) - started ))
[ "${unit}" -eq 0 ] && [ "${rest}" -eq 0 ] && [ "${container}" -eq 0 ]
