"""Vision Transformer (ViT) image classifier, a Keras model on the engine: `model.name: vit`.

The keys are modelzoo's vision_transformer params (image_size, num_channels, patch_size,
hidden_size, num_hidden_layers, num_heads, filter_size, prepend_cls_token, ...): a
convolutional patch embedding, a class token, learned position embeddings, pre-LN encoder
blocks, the class token's LayerNorm'd state to the logits. Trained here on the UCI digits
(the cnn family's input, resized to image_size); ViT-Base/16 compiles at ImageNet's 224x224.
No TensorFlow import here.
"""

from cerebras_models.cnn import UNAPPLIED, check_cnn_params
from cerebras_tf.registry import ModelSpec, register
from cerebras_tf.schema import Field

_ON = "(only true is built)"

SCHEMA = {
    "model": {
        "image_size": Field("int_list", [8, 8], "[H, W] the images are resized to"),
        "num_channels": Field("int", 1, "image channels (the gray digits are repeated)", low=1),
        "patch_size": Field("int_list", [2, 2], "[h, w] of a patch (one token each)"),
        "hidden_size": Field("int", 64, "token width", low=1),
        "num_hidden_layers": Field("int", 2, "encoder blocks", low=1),
        "num_heads": Field("int", 4, "attention heads", low=1),
        "filter_size": Field("int", 128, "MLP width", low=1),
        "num_classes": Field("int", 10, "classes", low=2),
        "nonlinearity": Field("str", "gelu", "MLP activation", choices=("gelu", "relu")),
        "layer_norm_epsilon": Field("float", 1e-6, "LayerNorm epsilon", low=0, low_open=True),
        "dropout_rate": Field("float", 0.0, "dropout after attention and MLP", low=0, high=1,
                              high_open=True),
        "attention_dropout_rate": Field("float", 0.0, "dropout of the attention weights",
                                        low=0, high=1, high_open=True),
        "embedding_dropout_rate": Field("float", 0.0, "dropout of the patch embeddings",
                                        low=0, high=1, high_open=True),
        "initializer_range": Field("float", 0.02, "stddev of the truncated-normal "
                                   "initializers", low=0, low_open=True),
        "seed": Field("int", 0, "initializer seed", low=0),
        "prepend_cls_token": Field("bool", True, f"a class token before the patches {_ON}"),
        "use_conv_patchified_embedding": Field("bool", True, f"patches by a strided Conv2D "
                                               f"{_ON}"),
        "norm_first": Field("bool", True, f"pre-LN blocks {_ON}"),
        "use_encoder_pooler_layer": Field("bool", False, "a tanh Dense on the class token "
                                          "before the classifier"),
        "pooler_nonlinearity": Field("str", "tanh", "the pooler's activation",
                                     choices=("tanh",)),
        "position_embedding_type": Field("str", "learned", "learned position embeddings",
                                         choices=("learned",)),
        "attention_type": Field("str", "scaled_dot_product", "scores scaled by "
                                "1/sqrt(head size)", choices=("scaled_dot_product",)),
        "attention_softmax_fp32": Field("bool", True, "modelzoo key (the softmax is fp32)"),
        "use_projection_bias_in_attention": Field("bool", True, f"Q/K/V biases {_ON}"),
        "use_ffn_bias_in_attention": Field("bool", True, f"output projection bias {_ON}"),
        "use_ffn_bias": Field("bool", True, f"MLP biases {_ON}"),
    },
}

_ONLY_TRUE = ("prepend_cls_token", "use_conv_patchified_embedding", "norm_first",
              "use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")


def check_vit_params(out: dict, fail) -> None:
  check_cnn_params(out, fail)
  model = out["model"]
  for key in _ONLY_TRUE:
    if model.get(key) is False:
      fail(("model", key), f"model.{key}: false is not built (the ViT here has it); remove "
           f"the key")
  for key in ("image_size", "patch_size"):
    if len(model[key]) != 2 or min(model[key]) < 1:
      fail(("model", key), f"model.{key} must be [H, W], got {model[key]}")
  if any(i % p for i, p in zip(model["image_size"], model["patch_size"])):
    fail(("model", "patch_size"), f"model.patch_size {model['patch_size']} must divide "
         f"model.image_size {model['image_size']}")
  if model["hidden_size"] % model["num_heads"]:
    fail(("model", "num_heads"), f"model.num_heads {model['num_heads']} must divide "
         f"model.hidden_size {model['hidden_size']}")


SPEC = register(ModelSpec(name="vit", model_fn="cerebras_models.vit.model:model_fn",
                          input_fn="cerebras_models.cnn.model:input_fn", schema=SCHEMA,
                          check=check_vit_params,
                          unapplied=UNAPPLIED))
