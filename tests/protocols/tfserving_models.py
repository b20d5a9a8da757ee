"""SavedModels for the TF Serving tests, written by TensorFlow's own SavedModelBuilder (the TF1 API, the one
that writes classify and regress signatures) in TF Serving's layout: `<model>/<version>/saved_model.pb`.

`recommender` signatures:
- serving_default (predict): x FP32 [batch] -> y = 2x + 1 [batch] (rank 1: one scalar per instance)
- dense (predict): features FP32 [batch, 3] -> scores [batch, 2] = features @ W, total [batch]
- pair (predict): ids INT64 [batch, 2], weight FP32 [batch] -> weighted FP32 [batch, 2]
- strings (predict): s STRING [batch] -> upper STRING [batch], length INT32 [batch]
- classify (classify): inputs STRING [batch] tf.Examples with "f" (float) -> classes [batch, 2]
  ("neg", "pos"), scores [batch, 2] = (1 - sigmoid(f), sigmoid(f))
- regress (regress): inputs STRING [batch] tf.Examples with "f" (float) and "k" (int64) -> outputs [batch, 1] =
  3f + k
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = np.array([[1.0, -1.0], [0.5, 2.0], [-2.0, 0.25]], np.float32)


def save_recommender(version_dir: Path) -> Path:
    import tensorflow as tf

    v1 = tf.compat.v1
    signature_def = v1.saved_model.signature_def_utils
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        x = v1.placeholder(tf.float32, [None], name="x")
        y = 2.0 * x + 1.0
        features = v1.placeholder(tf.float32, [None, 3], name="features")
        scores = tf.matmul(features, tf.constant(WEIGHTS))
        total = tf.reduce_sum(features, axis=1)
        ids = v1.placeholder(tf.int64, [None, 2], name="ids")
        weight = v1.placeholder(tf.float32, [None], name="weight")
        weighted = tf.cast(ids, tf.float32) * tf.expand_dims(weight, 1)
        s = v1.placeholder(tf.string, [None], name="s")
        upper = tf.strings.upper(s)
        length = tf.strings.length(s)
        serialized = v1.placeholder(tf.string, [None], name="examples")
        parsed = tf.io.parse_example(serialized, {
            "f": tf.io.FixedLenFeature([1], tf.float32),
            "k": tf.io.FixedLenFeature([1], tf.int64, default_value=[0]),
        })
        probability = tf.sigmoid(parsed["f"])
        class_scores = tf.concat([1.0 - probability, probability], axis=1)
        classes = tf.tile(tf.constant([["neg", "pos"]]), [tf.shape(serialized)[0], 1])
        regression = 3.0 * parsed["f"] + tf.cast(parsed["k"], tf.float32)
        predict = signature_def.predict_signature_def
        signatures = {
            "serving_default": predict({"x": x}, {"y": y}),
            "dense": predict({"features": features}, {"scores": scores, "total": total}),
            "pair": predict({"ids": ids, "weight": weight}, {"weighted": weighted}),
            "strings": predict({"s": s}, {"upper": upper, "length": length}),
            "classify": signature_def.classification_signature_def(serialized, classes, class_scores),
            "regress": signature_def.regression_signature_def(serialized, regression),
        }
        builder = v1.saved_model.Builder(str(version_dir))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map=signatures)
        builder.save()
    return version_dir


def expected_y(x: Any) -> np.ndarray:
    return 2.0 * np.asarray(x, np.float32) + 1.0


def expected_scores(f: float) -> list[float]:
    p = 1.0 / (1.0 + np.exp(-np.float32(f)))
    return [float(1.0 - p), float(p)]
