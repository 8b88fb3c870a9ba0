# mazerl trainer: the GPU image of the RayJob (Ray head and workers: vLLM rollouts, FSDP2 updates).
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

WORKDIR /opt/mazerl
# vLLM 0.33.0, the torch pair it pins and the project's transformers pin: one set of pins with the
# package and the CPU tests (requirements/constraints.txt; `make check-image-pins` resolves them).
# Its own layer, before the source, so a code change does not reinstall vLLM.
COPY --chown=1000:100 requirements/trainer.txt requirements/
RUN pip install -r requirements/trainer.txt

COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 src/ src/
# mazerl's own dependencies: all already satisfied by the layer above (torch, transformers stay).
# Configs and models are package data.
RUN pip install './[aws]'

USER 1000
CMD ["mazerl", "--help"]
