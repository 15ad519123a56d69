# The real agent clients, pinned, for tests/integration/test_agent_clients.py and `python -m service launch`:
# installed from npm into the repo's cache, never globally (about a minute). A version bump is one line here.
#   make agent-clients
CLAUDE_CODE_VERSION := 2.1.332
CODEX_VERSION := 0.171.0
AGENT_CLIENTS := .cache/agent-clients
# Keyed on the versions: a bump installs again, anything else does not.
AGENT_CLIENTS_STAMP := $(AGENT_CLIENTS)/.installed-claude-code-$(CLAUDE_CODE_VERSION)-codex-$(CODEX_VERSION)

.PHONY: agent-clients

agent-clients: $(AGENT_CLIENTS_STAMP)

test-tools: agent-clients

$(AGENT_CLIENTS_STAMP):
	command -v npm >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm; }
	rm -f $(AGENT_CLIENTS)/.installed-*
	npm install --prefix $(AGENT_CLIENTS) --no-audit --no-fund --loglevel=error \
	  @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION) @openai/codex@$(CODEX_VERSION)
	touch $@
