"""Real data for the reference models: acquisition into a local cache and TFRecord conversion.

    from cerebras_models.data import ensure_datasets
    paths = ensure_datasets(["vocab", "bert_pretrain"])   # fast when already prepared

See `models/data/acquire.py` for the sources and the output contract.
"""

from cerebras_models.data.acquire import (
    DATASETS, AcquireError, SourceUnavailableError, default_data_dir, ensure_datasets)

__all__ = ["DATASETS", "AcquireError", "SourceUnavailableError", "default_data_dir",
           "ensure_datasets"]
