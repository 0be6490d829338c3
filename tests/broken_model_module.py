"""A user's model module with a typo that fails its import (a NameError), named through
CEREBRAS_TF_MODEL_MODULES=broken_model_module (docs/bad_inputs.md row model_module_raises)."""

from cerebras_tf.registry import ModelSpec

regster(ModelSpec(name="broken", model_fn="x:y", input_fn="x:z"))  # noqa: F821  the typo
