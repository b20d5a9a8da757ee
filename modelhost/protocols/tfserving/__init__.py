"""TensorFlow Serving REST front-end: predict bodies in row and columnar JSON."""
