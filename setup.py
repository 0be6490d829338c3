"""cerebras_tf: tf.estimator-compatible training for a simulated Cerebras wafer-scale engine."""

from setuptools import find_packages, setup

MODELS = ["cerebras_models"] + [f"cerebras_models.{p}" for p in find_packages("models")]
# The reference families, found by the framework through this entry-point group (name -> package).
FAMILIES = ["bert", "cnn", "gpt", "linformer", "mlp", "t5", "transformer", "unet", "vit"]

setup(
    name="cerebras_tf",
    version="0.1.0",
    description="TensorFlow Estimator-compatible training framework for a simulated Cerebras CS-2",
    python_requires=">=3.11,<3.12",
    # The framework is cerebras_tf; the reference models live in the checkout's top-level
    # models/ (as the model zoo stands beside the framework) and install as `cerebras_models`,
    # so nothing named `models` can shadow a user's own models.py.
    packages=find_packages(include=["cerebras_tf", "cerebras_tf.*"]) + MODELS
    # `cerebras.tf.cs_estimator` / `.run_config`, the Cerebras R1.x import paths: a namespace
    # package portion (no cerebras/__init__.py), so a real Cerebras install keeps its own.
    + ["cerebras.tf"],
    package_dir={"cerebras_models": "models"},
    package_data={"cerebras_tf.engine": ["specs/*.yaml"], "cerebras_models": ["*/README.md"]},
    install_requires=[
        "tensorflow==2.15.1",       # the last release with tf.estimator
        "tensorflow-text==2.15.0",  # BertTokenizer, MLM masking, WordPiece vocab builder
        "numpy<2",
        "absl-py",
        "pyyaml",
        "matplotlib",               # scaling charts; the wafer picture's colour map and font
        "pillow",                   # draws wafer.png (matplotlib requires it too)
        "h5py",                     # modelzoo's HDF5 datasets (TensorFlow requires it too)
        "sacrebleu",                # BLEU of the Transformer's detokenized translations
    ],
    extras_require={
        # pytest-xdist: `dev.py test` runs the suite on 2 worker processes (2-core CI).
        # threadpoolctl: the benchmarks name the BLAS kernel numpy runs (the fp32 limit).
        "test": ["pytest", "hypothesis", "pytest-xdist==3.8.0", "threadpoolctl"],
        "data": ["pysword"],        # reads the Debian SWORD Bible modules (real text corpora)
    },
    entry_points={"cerebras_tf.model_families": [f"{f} = cerebras_models.{f}" for f in FAMILIES],
                  "console_scripts": ["cerebras-run = cerebras_tf.cli:run_main",
                                      "cerebras-launch = cerebras_tf.runtime.launcher:console_main",
                                      "cerebras-prepare-data = "
                                      "cerebras_models.data.prepare:console_main"]},
)
