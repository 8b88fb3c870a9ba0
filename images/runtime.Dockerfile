# mazerl runtime: the image of every KFP task pod (CPU). Build from the repository root:
#   docker build -f images/runtime.Dockerfile -t <registry>/mazerl-runtime:<tag> .
# then pin it by digest in the profile (images.runtime: <registry>/mazerl-runtime@sha256:...).
FROM python:3.11.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Every dependency at the version requirements/runtime.lock names (images/lock.py writes it: the
# torch/torchvision pair the tests run with, PyPI's CUDA-enabled build that also runs on CPU, so an
# evaluation task can use a GPU node's device; the Qwen3-VL processor needs torchvision). Its own
# layer, before the source, so a code change does not reinstall torch.
WORKDIR /opt/mazerl
COPY requirements/runtime.lock requirements/
RUN pip install -r requirements/runtime.lock

# Components call mazerl.workflow; the job configs, profiles, VisGym reference mazes and tiny-base
# are package data, so a plain (non-editable) install carries everything a task reads. --no-deps:
# the lock above already holds them; pip check fails the build if it does not.
COPY pyproject.toml README.md ./
COPY src/ src/
COPY components/ components/
COPY pipelines/ pipelines/
RUN pip install --no-deps './[kfp,aws]' \
    && pip check \
    && useradd --create-home --uid 1000 mazerl
USER 1000
ENTRYPOINT []
CMD ["mazerl", "--help"]
