# modelhost as a SageMaker bring-your-own-container image, for single-model and multi-model endpoints.
# SageMaker runs `docker run <image> serve`: the argument `serve` reaches the `serve` entry, which accepts it.
FROM python:3.11-slim

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The extras installed: e.g. --build-arg EXTRAS=sagemaker,torch for PyTorch models, with
# --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu for torch's CPU build (docs/backends/pytorch.md);
# sagemaker,tensorflow for SavedModels. pip reads PIP_EXTRA_INDEX_URL from the environment.
ARG EXTRAS=sagemaker
ARG PIP_EXTRA_INDEX_URL
COPY pyproject.toml README.md /tmp/modelhost/
COPY modelhost /tmp/modelhost/modelhost
RUN pip install "/tmp/modelhost[${EXTRAS}]" && rm -rf /tmp/modelhost

EXPOSE 8080
# Exec form: the server is PID 1 and receives SageMaker's SIGTERM itself.
ENTRYPOINT ["serve"]
