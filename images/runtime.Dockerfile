# mazerl runtime: the image of every KFP task pod (CPU). Build from the repository root:
#   docker build -f images/runtime.Dockerfile -t <registry>/mazerl-runtime:<tag> .
# then pin it by digest in the profile (images.runtime: <registry>/mazerl-runtime@sha256:...).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The torch/torchvision pair the test suite runs with (PyPI's build: CUDA-enabled, also runs on CPU,
# so evaluation tasks can use a GPU node's device). The Qwen3-VL processor needs torchvision.
# Its own layer, before the source, so a code change does not reinstall torch.
RUN pip install torch==2.14.1 torchvision==0.29.1

# Components call mazerl.workflow; the job configs, profiles, VisGym reference mazes and tiny-base
# are package data, so a plain (non-editable) install carries everything a task reads.
WORKDIR /opt/mazerl
COPY pyproject.toml README.md ./
COPY src/ src/
RUN pip install './[kfp,aws]' \
    && useradd --create-home --uid 1000 mazerl
USER 1000
ENTRYPOINT []
CMD ["mazerl", "--help"]
