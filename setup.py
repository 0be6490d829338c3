"""cerebras_tf: tf.estimator-compatible training for a simulated Cerebras wafer-scale engine."""

from setuptools import find_packages, setup

setup(
    name="cerebras_tf",
    version="0.1.0",
    description="TensorFlow Estimator-compatible training framework for a simulated Cerebras CS-2",
    python_requires=">=3.11,<3.12",
    # One top-level package: the reference models are cerebras_tf.models (a top-level `models`
    # would shadow any user's own models.py).
    packages=find_packages(include=["cerebras_tf", "cerebras_tf.*"])
    # `cerebras.tf.cs_estimator` / `.run_config`, the Cerebras R1.x import paths: a namespace
    # package portion (no cerebras/__init__.py), so a real Cerebras install keeps its own.
    + ["cerebras.tf"],
    package_data={"cerebras_tf.engine": ["specs/*.yaml"], "cerebras_tf.models": ["*/README.md"]},
    install_requires=[
        "tensorflow==2.15.1",       # the last release with tf.estimator
        "tensorflow-text==2.15.0",  # BertTokenizer, MLM masking, WordPiece vocab builder
        "numpy<2",
        "absl-py",
        "pyyaml",
        "matplotlib",               # wafer placement and scaling pictures
        "h5py",                     # modelzoo's HDF5 datasets (TensorFlow requires it too)
        "sacrebleu",                # BLEU of the Transformer's detokenized translations
    ],
    extras_require={
        # pytest-xdist: `dev.py test` runs the suite on 2 worker processes (2-core CI).
        "test": ["pytest", "hypothesis", "pytest-xdist==3.8.0"],
        "data": ["pysword"],        # reads the Debian SWORD Bible modules (real text corpora)
    },
    entry_points={"console_scripts": ["cerebras-run = cerebras_tf.cli:run_main",
                                        "cerebras-launch = cerebras_tf.runtime.launcher:console_main",
                                        "cerebras-prepare-data = "
                                        "cerebras_tf.models.data.prepare:console_main"]},
)
