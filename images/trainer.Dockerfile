# mazerl trainer: the GPU image of the RayJob (Ray head and workers: vLLM rollouts, FSDP2 updates) and
# of the evaluate tasks of profiles with eval_engine vllm.
# Build from the repository root:
#   docker build -f images/trainer.Dockerfile -t <registry>/mazerl-trainer:<tag> .
# then pin it by digest in the profile (images.trainer: <registry>/mazerl-trainer@sha256:...).
# Ray's CUDA image brings CUDA, NCCL and a matching Python; vLLM pins the torch it was built for.
FROM rayproject/ray:2.60.0-py311-cu128

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # EFA on p5/p4d nodes: libfabric's EFA provider with GPUDirect RDMA (HyperPod facts in DESIGN.md)
    FI_PROVIDER=efa \
    FI_EFA_USE_DEVICE_RDMA=1 \
    NCCL_DEBUG=WARN

# EFA's user-space stack (libfabric with the EFA provider, rdma-core) and the NCCL plugin that routes
# NCCL over it (aws-ofi-nccl, bundled with the installer: 1.51.0 ships plugin 1.22.0). The node,
# not the image, carries the kernel driver (--skip-kmod), and a container has no limits.conf to
# edit (--skip-limit-conf). NCCL dlopens the plugin by name: its folder goes into the loader path,
# and the build fails if the installer left no plugin.
ARG EFA_INSTALLER_VERSION=1.51.0
USER 0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /tmp/efa
RUN curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      | tar -xz --strip-components=1 \
    && ./efa_installer.sh -y -g --skip-kmod --skip-limit-conf --no-verify \
    && plugin="$(find /opt/amazon -name 'libnccl-net*.so' -printf '%h\n' | head -n 1)" \
    && test -n "$plugin" \
    && echo "$plugin" > /etc/ld.so.conf.d/aws-ofi-nccl.conf \
    && echo /opt/amazon/efa/lib > /etc/ld.so.conf.d/efa.conf \
    && ldconfig \
    && rm -rf /tmp/efa/* /var/lib/apt/lists/*
USER 1000

WORKDIR /opt/mazerl
# vLLM 0.33.0, the torch pair it pins, the project's transformers and Ray pins and everything they
# pull in, each at the version requirements/trainer.lock names (images/lock.py resolves it from
# requirements/trainer.txt and the package). Its own layer, before the source, so a code change
# does not reinstall vLLM.
COPY --chown=1000:100 requirements/trainer.lock requirements/
RUN pip install -r requirements/trainer.lock

COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 src/ src/
COPY --chown=1000:100 components/ components/
COPY --chown=1000:100 pipelines/ pipelines/
# mazerl itself; its dependencies are in the lock (pip check fails the build if one is missing).
# Configs and models are package data. [kfp]: the evaluate tasks of a profile with eval_engine vllm
# run as KFP components in this image (the KFP executor imports kfp).
RUN pip install --no-deps './[kfp,aws]' && pip check

USER 1000
CMD ["mazerl", "--help"]
