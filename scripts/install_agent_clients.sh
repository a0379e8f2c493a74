#!/usr/bin/env bash
# Install the real agent clients that tests/e2e/test_agent_clients.py runs against `rlonce serve`,
# at the versions recorded in tests/compat/README.md, into DEST (default: .agents in the repository
# root; the test reads RLONCE_AGENT_CLIENTS, default .agents):
#   DEST/node_modules/.bin/{claude,codex,opencode,qwen}   npm --prefix DEST
#   DEST/venv/bin/{llm,python}                            a venv with llm and openai-agents
# Needs node >= 20 with npm, and python3 >= 3.10 with venv. Installs from npm and PyPI only.
#   scripts/install_agent_clients.sh [DEST]      (make agents)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-${RLONCE_AGENT_CLIENTS:-$ROOT/.agents}}"
PYTHON="${PYTHON:-python3}"

NPM_PACKAGES=(
  "@anthropic-ai/claude-code@2.1.197"
  "@openai/codex@0.171.0"
  "opencode-ai@1.18.33"
  "@qwen-code/qwen-code@0.15.10"
)
PY_PACKAGES=(
  "llm==0.36"
  "openai-agents==0.24.0"
  "openai==3.57.0"
)

need() { command -v "$1" >/dev/null 2>&1 || { echo "install_agent_clients: '$1' not found on PATH ($2)" >&2; exit 1; }; }
need node "install Node.js 20 or newer"
need npm "it comes with Node.js"
need "$PYTHON" "set PYTHON=... to a Python 3.10+ interpreter"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "install_agent_clients: node $(node --version) is too old; the clients need node 20 or newer" >&2
  exit 1
fi

mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
echo "installing agent clients into $DEST"

# npm: a package.json of its own so that --prefix installs here and not in a parent project
[ -f "$DEST/package.json" ] || echo '{"private": true}' > "$DEST/package.json"
npm install --prefix "$DEST" --save-exact --no-fund --no-audit --loglevel=error "${NPM_PACKAGES[@]}"
for exe in claude codex opencode qwen; do
  [ -x "$DEST/node_modules/.bin/$exe" ] || { echo "install_agent_clients: $exe missing after npm install" >&2; exit 1; }
done

# Python clients in their own venv (not the project's: openai-agents pins its own openai)
[ -x "$DEST/venv/bin/python" ] || "$PYTHON" -m venv "$DEST/venv"
"$DEST/venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
"$DEST/venv/bin/python" -c 'import agents, openai' >/dev/null
[ -x "$DEST/venv/bin/llm" ] || { echo "install_agent_clients: llm missing after pip install" >&2; exit 1; }

echo "installed:"
for exe in claude codex opencode qwen; do
  printf '  %-9s %s\n' "$exe" "$("$DEST/node_modules/.bin/$exe" --version 2>/dev/null | head -n 1 || echo '?')"
done
printf '  %-9s %s\n' llm "$("$DEST/venv/bin/llm" --version 2>/dev/null || echo '?')"
printf '  %-9s %s\n' agents "$("$DEST/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("openai-agents"))')"
