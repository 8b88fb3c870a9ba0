# mazerl trainer: the GPU image of the RayJob (Ray head and workers: vLLM rollouts, FSDP2 updates).
# Build from the repository root:
#   docker build -f images/trainer.Dockerfile -t <registry>/mazerl-trainer:<tag> .
# then pin it by digest in the profile (images.trainer: <registry>/mazerl-trainer@sha256:...).
# Ray's CUDA image brings CUDA, NCCL and a matching Python; vLLM pins the torch it was built for.
FROM rayproject/ray:2.49.2-py311-cu128

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # EFA on p5/p4d nodes: libfabric's EFA provider with GPUDirect RDMA (HyperPod facts in DESIGN.md)
    FI_PROVIDER=efa \
    FI_EFA_USE_DEVICE_RDMA=1 \
    NCCL_DEBUG=WARN

RUN pip install vllm==0.11.0

WORKDIR /opt/mazerl
COPY --chown=1000:100 pyproject.toml README.md ./
COPY --chown=1000:100 src/ src/
# mazerl's own dependencies only: keep the torch that vLLM installed. Configs and models are package data.
RUN pip install './[aws]'

USER 1000
CMD ["mazerl", "--help"]
