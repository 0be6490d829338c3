"""Linformer's input: models/bert's pretraining input_fn as it is (modelzoo's Linformer reads
BERT's MLM-only TFRecords processors: `BertMlmOnlyTfRecordsDynamicMaskProcessor`, ...).

Features: token_ids, segment_ids, padding_mask [B, S] int32; masked_lm_positions,
masked_lm_ids [B, P] int32, masked_lm_weights [B, P] float32; S is the section's
max_sequence_length (static: the Linformer projections are [S, k])."""

from cerebras_models.bert.input import input_fn  # noqa: F401  (the registry's INPUT_FN)
