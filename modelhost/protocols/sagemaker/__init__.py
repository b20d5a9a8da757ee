"""SageMaker hosting front-end: /ping, /invocations, multi-model /models, and inference.py handler conventions."""
