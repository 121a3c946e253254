# eks-dra: `make synth` and `make test` do all set-up on a fresh machine.
SHELL := /bin/bash
ENV ?= dev
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed

# jsii and the CDK CLI run on the Node.js 22 pinned in package.json (the machine's Node 20 is end of life).
export PATH := $(CURDIR)/node_modules/.bin:$(CURDIR)/$(VENV)/bin:$(PATH)
# Offline and quiet: no version check, no CLI telemetry, no notices.
export CDK_DISABLE_VERSION_CHECK := 1
export CDK_DISABLE_CLI_TELEMETRY := true
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: deps synth test lint e2e e2e-node bench bench-e2e gpu-check protos clean

deps: $(PY_STAMP) $(NODE_STAMP)

$(PY_STAMP): requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade 'pip>=25'
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

synth: deps
	rm -rf cdk.out dist/$(ENV)
	cdk synth -c env=$(ENV) --no-notices --quiet > /dev/null
	eks-dra plan -c env=$(ENV)

lint: deps
	ruff check eks_dra tests bench app.py

test: deps lint
	$(PY) -m pytest -q -p no:cacheprovider

e2e: deps
	bash tests/e2e/build.sh
	$(PY) -m pytest -q -p no:cacheprovider -m e2e tests/e2e

# Just the real-node tier (real kubelet + containerd; as root; builds are cached in ~/.cache/eks-dra/node).
e2e-node: deps
	bash tests/e2e/build.sh
	$(PY) -m pytest -q -p no:cacheprovider -s tests/e2e/test_real_node.py

bench: deps
	$(PY) bench/synth.py
	$(PY) bench/plan.py
	$(PY) bench/driver.py

# The real-control-plane figures (Go toolchain needed): pod-to-prepared latency, scheduler vs planner,
# and the field-failure scenarios at the issue's full counts.
bench-e2e: deps
	bash tests/e2e/build.sh
	$(PY) bench/e2e.py
	$(PY) bench/field_failures.py

gpu-check: deps
	$(PY) -m eks_dra.drivers.gpu_check

protos: deps
	$(PY) -m eks_dra.drivers.proto.generate

clean:
	rm -rf cdk.out dist .pytest_cache
