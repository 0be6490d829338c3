"""SavedModel serving for the ViT: the cnn family's image receiver (same input, same name)."""

from cerebras_models.cnn.model import serving_input_receiver_fn  # noqa: F401
