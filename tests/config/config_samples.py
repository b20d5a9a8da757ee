"""Config texts the config tests share: a full config exercising every field, DenseNet's, and a small builder.
"""

from __future__ import annotations

# A config written the way people write them for Triton: comments, `key : value` spacing,
# list and block forms, enums, maps, every scheduling/instance knob modelhost parses.
FULL_CONFIG = """
# The "simple" model from Triton's quickstart, with every common section.
name: "simple"
platform: "onnxruntime_onnx"   # or backend: "onnxruntime"
max_batch_size : 8
version_policy: { specific: { versions: [ 1, 3 ] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
    optional: true
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4, 4 ]
    reshape: { shape: [ 16 ] }
    label_filename: "labels.txt"
  }
]
output {
  name: "OUTPUT1"
  data_type: TYPE_STRING
  dims: [ -1 ]
}
instance_group [
  { name: "cpu_pool" count: 2 kind: KIND_CPU },
  { count: 1 kind: KIND_AUTO }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000
    allow_timeout_override: true
    max_queue_size: 16
  }
  priority_queue_policy { key: 1 value: { max_queue_size: 4 } }
}
optimization { graph { level: 1 } }
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters [
  { key: "graph_optimization_level" value: { string_value: "basic" } }
]
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
"""

# Triton's densenet_onnx example config, verbatim in substance.
DENSENET_CONFIG = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""


def simple_config(
    max_batch_size: int = 8, in_type: str = "TYPE_FP32", in_dims: str = "16", extra_input: str = ""
) -> str:
    return f"""
max_batch_size: {max_batch_size}
input [
  {{ name: "INPUT0" data_type: {in_type} dims: [ {in_dims} ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
  {extra_input}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""
