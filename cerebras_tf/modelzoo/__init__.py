"""Cerebras modelzoo's params files, read as they are written; all of the translation is here.

- `tf_files`: modelzoo's TF-release files as plain data: the family a file is for (its
  `data_processor`, its model keys; families not built here named), the keys that steer only
  the CS compiler, modelzoo TF names and their owners here, keys built one way, initializer
  specs, TF's Cosine form, list-valued `data_dir`.
- `trainer_files`: the trainer format (R2.3 on: `trainer.init` / `trainer.fit`) moved onto the
  flat sections, lines kept.
- `translate`: the validator's steps that use those tables (params.py calls them): the family,
  modelzoo names moved onto their owners here, PyTorch schedule names, unbuilt keys.

What each key does here: docs/modelzoo_migration.md. No TensorFlow.
"""
