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

.PHONY: deps synth deploy diff destroy schema test lint e2e e2e-node bench bench-e2e gpu-check protos clean

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

# Synthesize into a scratch folder and replace cdk.out and dist/$(ENV) only when synth succeeded: a failed synth
# leaves the last good output in place.
SYNTH_TMP := .synth-tmp
synth: deps
	rm -rf $(SYNTH_TMP)
	cdk synth -c env=$(ENV) -c dist=$(SYNTH_TMP)/dist -o $(SYNTH_TMP)/cdk.out --no-notices --quiet > /dev/null
	rm -rf cdk.out dist/$(ENV) && mkdir -p dist
	mv $(SYNTH_TMP)/cdk.out cdk.out && mv $(SYNTH_TMP)/dist/$(ENV) dist/$(ENV) && rm -rf $(SYNTH_TMP)
	eks-dra plan -c env=$(ENV)
	$(PY) -m eks_dra.stacks.synth_summary $(ENV)

# These need AWS credentials for the environment's account (and `cdk bootstrap` done once per account/region);
# deploy also needs a Docker engine to build the driver image. They act on the assembly `make synth` just checked.
deploy: synth
	cdk deploy --app cdk.out EksDra-$(ENV) --no-notices

diff: synth
	cdk diff --app cdk.out EksDra-$(ENV) --no-notices

destroy: synth
	cdk destroy --app cdk.out EksDra-$(ENV) --no-notices

lint: deps
	ruff check eks_dra tests bench app.py

test: deps lint
	$(PY) -m pytest -q -p no:cacheprovider

# The whole tier on both control planes: Kubernetes 1.34 (the default) and 1.36 (E2E_KUBERNETES=1.36).
# `make test` runs the 1.34 tier and the 1.36-only tests (tests/e2e/test_kubernetes_136.py).
e2e: deps
	bash tests/e2e/build.sh
	bash tests/e2e/build.sh 1.36
	$(PY) -m pytest -q -p no:cacheprovider -m e2e tests/e2e
	E2E_KUBERNETES=1.36 $(PY) -m pytest -q -p no:cacheprovider -m e2e tests/e2e

# Just the real-node tier (real kubelet + containerd; as root; builds are cached in ~/.cache/eks-dra/node).
e2e-node: deps
	bash tests/e2e/build.sh
	$(PY) -m pytest -q -p no:cacheprovider -s tests/e2e/test_real_node.py

bench: deps
	$(PY) bench/synth.py
	$(PY) bench/plan.py
	$(PY) bench/plan_jobset.py
	$(PY) bench/driver.py

# The real-control-plane figures (Go toolchain needed): pod-to-prepared latency, scheduler vs planner,
# the field-failure scenarios at full counts, and a recovery's memory among 8,000 claims.
bench-e2e: deps
	bash tests/e2e/build.sh
	$(PY) bench/e2e.py
	$(PY) bench/field_failures.py
	$(PY) bench/checkpoint_chaos.py
	$(PY) bench/recovery_memory.py

# On a node with an NVIDIA GPU: NVML (from the driver root) discovery, and our CDI edits against NVIDIA's
# pkg/nvcdi with the real NVML (tests/nvidia_ctk, Go needed). NVIDIA_DRIVER_ROOT: the driver root (default /).
gpu-check: deps
	$(PY) -m eks_dra.drivers.gpu.gpu_check --driver-root $(or $(NVIDIA_DRIVER_ROOT),/)

# The JSON Schema of config/*.yaml that editors read (the yaml-language-server line at the top of each file).
schema: deps
	$(PY) -m eks_dra.config_models config/schema

protos: deps
	$(PY) -m eks_dra.drivers.framework.proto.generate

clean:
	rm -rf cdk.out dist .pytest_cache .synth-tmp
