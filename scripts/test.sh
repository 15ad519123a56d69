#!/usr/bin/env bash
# `make test` after its set-up:  scripts/test.sh PYTHON PHASES_FILE STARTED_EPOCH
# Two streams of tests, each a pytest of its own, share the 2 cores: an engine start or an image build keeps about
# one core busy. This one: lint, the unit tests, then the integration tests (and any other test directory). Beside
# it: the container tests (image builds, the compose stack, each image served), the reliability tests, then the
# integration files in `moved` (engines of their own, no engine the integration package shares), which the first
# stream leaves out. Each stream takes about half of the time (docs/development.md, "Time budget"). The second stream's engines compute on
# the last CPU the machine allows (VLLM_CPU_OMP_THREADS_BIND, which the service keeps as the user's), the one the
# service's own plan keeps free of this stream's engine threads: two engines computing at once do not share a core.
# It runs its first container only once the unit tests are done: they read the live machine's free memory.
# At the end: the second stream's output, then every phase's time beside its budget (tests/support/phases.py).
set -uo pipefail
py="${1:?usage: test.sh PYTHON PHASES_FILE STARTED_EPOCH}"; phases="${2:?}"; started="${3:?}"
cd "$(dirname "$0")/.."
export TEST_PHASES="${phases}"
beside=(tests/container/ tests/reliability/)
moved=(tests/integration/test_gguf_llama_cpp.py tests/integration/test_gguf_file.py tests/integration/test_embeddings.py tests/integration/test_chat_template.py
  tests/integration/test_model_sources.py tests/integration/test_model_table.py)
unit_done=".cache/test-unit-done"; beside_log=".cache/test-beside.log"
rm -f "${unit_done}"

last_cpu=$("${py}" -c "import os; print(max(os.sched_getaffinity(0)))")
VLLM_CPU_OMP_THREADS_BIND="${last_cpu}" TEST_CONTAINERS_AFTER="${unit_done}" TEST_PHASES_MOVED=integration "${py}" -m pytest -q --durations=15 --basetemp=.cache/pytest-beside \
  -p no:cacheprovider "${beside[@]}" "${moved[@]}" > "${beside_log}" 2>&1 &
second=$!
echo "the container and reliability tests run beside these: ${beside_log}"
stop_second() { kill -INT "${second}" 2>/dev/null; wait "${second}" 2>/dev/null; }

s=$(date +%s)
if ! make --no-print-directory lint; then stop_second; exit 1; fi
printf 'lint\t%s\n' $(( $(date +%s) - s )) >> "${phases}"

"${py}" -m pytest -q --durations=10 tests/unit; unit=$?
touch "${unit_done}"
host=()
for dir in tests/*/; do
  case " tests/unit/ ${beside[*]} " in *" ${dir} "*) ;; *) host+=("${dir}") ;; esac
done
"${py}" -m pytest -q --durations=20 "${host[@]}" "${moved[@]/#/--ignore=}"; rest=$?
wait "${second}"; beside_rc=$?

echo "=== the container and reliability tests (${beside_log}) ==="
grep -v '^[.sxFE]*\s*\[ *[0-9]*%\]$' "${beside_log}" | tail -n 80
"${py}" -m tests.support.phases "${phases}" $(( $(date +%s) - started ))
[ "${unit}" -eq 0 ] && [ "${rest}" -eq 0 ] && [ "${beside_rc}" -eq 0 ]
