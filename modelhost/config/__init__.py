"""Triton model configuration: the config.pbtxt schema, its loader and its auto-completion."""

from modelhost.config.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

__all__ = ["DataType", "ModelConfig", "ModelInput", "ModelOutput"]
