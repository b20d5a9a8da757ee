# modelhost as a SageMaker bring-your-own-container image, for single-model and multi-model endpoints.
# SageMaker runs `docker run <image> serve`: the argument `serve` reaches the `serve` entry, which accepts it.
FROM python:3.11-slim

LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /tmp/modelhost/
COPY modelhost /tmp/modelhost/modelhost
RUN pip install "/tmp/modelhost[sagemaker]" && rm -rf /tmp/modelhost

EXPOSE 8080
# Exec form: the server is PID 1 and receives SageMaker's SIGTERM itself.
ENTRYPOINT ["serve"]
