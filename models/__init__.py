"""Reference models. Each family lives in `models/<name>/` and registers itself with
`cerebras_tf.registry.register` (see that module); `model.name` in a params file selects it.

Nothing is imported here: importing `models` must not import TensorFlow.
"""
