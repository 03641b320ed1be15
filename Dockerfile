# The image every compose service builds from: the project and its dependencies in a venv.
#
#   docker build -t hpo-service:cpu .                          # CPU (head, CPU workers)
#   docker build --build-arg TORCH_CUDA=cu128 -t hpo-service:cu128 .   # GPU workers
#
# TORCH_CUDA selects which PyTorch build is installed (the index of
# download.pytorch.org/whl/<TORCH_CUDA>: cpu, cu126, cu128, ...). The CUDA wheels
# carry their own CUDA runtime; the driver comes from the host through the NVIDIA
# Container Toolkit, so the same Python base serves both. BASE_IMAGE may name
# another Debian-based image with Python 3.11 on its PATH.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG TORCH_CUDA=cpu
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/hpo \
    PATH=/opt/hpo/bin:$PATH

RUN python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
 && python3 -m venv /opt/hpo \
 && pip install --upgrade pip

# torch first, from the selected build; the project pins the same version (torch==2.13.0
# also matches 2.13.0+cu128), so installing the project adds nothing of torch's.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/${TORCH_CUDA}

WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainers ./trainers
COPY hpo ./hpo
COPY service ./service
RUN pip install . && python -c "import hpo, service, trainers, torch; print(torch.__version__)"

# Study results, checkpoints and the SQLite default live under /data (compose mounts
# the shared volume at /shared and points HPO_RESULTS_DIR there).
RUN useradd --create-home --uid 1000 hpo && mkdir -p /data /shared && chown hpo /data /shared
USER hpo
WORKDIR /data
ENV HPO_HOST=0.0.0.0 HPO_PORT=8000
EXPOSE 8000 6379
CMD ["hpo", "serve"]
