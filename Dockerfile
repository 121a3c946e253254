# syntax=docker/dockerfile:1
# One image for the three eks-dra DRA drivers:  eks-dra-driver {gpu|efa|neuron}
#
# - Base pinned by version (python 3.11 patch release on Debian bookworm, slim). Pin the digest too where the
#   build can reach the registry: docker buildx imagetools inspect python:3.11.14-slim-bookworm, then
#   FROM python:3.11.14-slim-bookworm@sha256:<digest> (this repository is built offline, so no digest is
#   recorded here).
# - Only the drivers' runtime subset of requirements.lock is installed, at the locked versions, without
#   dependency resolution (--no-deps): grpc, protobuf, the kubernetes client and what its REST/config code
#   imports, prometheus-client, nvidia-ml-py. No CDK, jsii, cdk8s, boto3, aiohttp, Node.js.
# - Runs as root, on purpose: a kubelet plugin must create sockets in /var/lib/kubelet/plugins_registry and
#   /var/lib/kubelet/plugins (root-owned, 0700/0750 on AL2023 and Bottlerocket), write /var/run/cdi and use
#   NVML / nvidia-smi on /dev/nvidia*; the DaemonSet runs it privileged like every DRA driver's. The image
#   itself writes nothing outside those mounts (bytecode is precompiled), so readOnlyRootFilesystem works.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY eks_dra ./eks_dra
# The runtime subset, versions taken from the lock file (one source of truth for versions).
RUN set -eu; \
    runtime="certifi charset-normalizer durationpy grpcio grpcio-health-checking idna kubernetes nvidia-ml-py \
oauthlib prometheus_client protobuf python-dateutil PyYAML requests requests-oauthlib six typing_extensions urllib3"; \
    : > runtime.txt; \
    for name in $runtime; do \
      line=$(grep -i -E "^${name}==" requirements.lock) || { echo "requirements.lock has no pin for $name" >&2; exit 1; }; \
      echo "$line" >> runtime.txt; \
    done; \
    python -m venv /opt/eks-dra; \
    /opt/eks-dra/bin/pip install --no-deps --only-binary=:all: -r runtime.txt; \
    /opt/eks-dra/bin/pip install --no-deps --no-build-isolation . || \
      /opt/eks-dra/bin/pip install --no-deps .; \
    /opt/eks-dra/bin/python -m compileall -q /opt/eks-dra/lib/python3.11/site-packages; \
    /opt/eks-dra/bin/eks-dra-driver --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="eks-dra-driver" \
      org.opencontainers.image.description="eks-dra DRA kubelet plugins for NVIDIA GPUs, EFA and AWS Neuron" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/eks-dra/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/eks-dra /opt/eks-dra
USER 0:0
ENTRYPOINT ["eks-dra-driver"]
CMD ["--help"]
