"""Greedy and beam-search decoding over a cached step function, as in-graph while loops.

A step function maps (ids [B', 1] int32, step int32, cache dict) -> (logits [B', V], cache);
every cache tensor has the (flattened) batch as its first axis and a static shape, so the
loop state never changes shape. Beam search flattens [B, K] to B*K for the step function.

Beam search follows the usual formulation (tensor2tensor, Model Garden): K alive and K
finished hypotheses per example; each step takes the top 2K extensions, so K of them that do
not end are always there to stay alive; an extension by [END] finishes only if it ranks in
the top K (as in fairseq), which makes width 1 exactly greedy decoding. Finished scores are log P / lp(length) with
lp = ((5 + length) / 6) ** alpha (Wu et al., 2016). The loop stops early once no alive
hypothesis can beat the worst finished one.
"""

from typing import Callable, Dict, Tuple

import tensorflow as tf

NEG_INF = -1e9

StepFn = Callable[[tf.Tensor, tf.Tensor, Dict[str, tf.Tensor]],
                  Tuple[tf.Tensor, Dict[str, tf.Tensor]]]


def greedy_decode(step_fn: StepFn, cache, batch_size, max_length: int, start_id: int,
                  end_id: int, pad_id: int = 0):
  """Argmax decoding.

  Returns:
    ids [B, max_length] int32 (tokens after [END] are pad_id), scores [B] float32 (sum of
    log-probs up to and including [END]).
  """
  ids = tf.fill([batch_size, max_length + 1], tf.constant(pad_id, tf.int32))
  ids = tf.concat([tf.fill([batch_size, 1], start_id), ids[:, 1:]], axis=1)
  finished = tf.zeros([batch_size], tf.bool)
  scores = tf.zeros([batch_size], tf.float32)

  def cond(i, ids, finished, scores, cache):
    del ids, scores, cache
    return tf.logical_and(i < max_length, tf.logical_not(tf.reduce_all(finished)))

  def body(i, ids, finished, scores, cache):
    logits, cache = step_fn(ids[:, i:i + 1], i, cache)
    log_probs = tf.nn.log_softmax(logits)
    token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
    token_lp = tf.gather(log_probs, token, batch_dims=1)
    scores += tf.where(finished, 0.0, token_lp)
    token = tf.where(finished, pad_id, token)
    ids = _write_column(ids, i + 1, token)
    finished = tf.logical_or(finished, tf.equal(token, end_id))
    return i + 1, ids, finished, scores, cache

  _, ids, _, scores, _ = tf.while_loop(
      cond, body, [tf.constant(0), ids, finished, scores, cache],
      shape_invariants=[tf.TensorShape([]), ids.shape, finished.shape, scores.shape,
                        tf.nest.map_structure(lambda t: t.shape, cache)],
      maximum_iterations=max_length)
  return ids[:, 1:], scores


def _write_column(ids, col, values):
  """ids [..., L] with ids[..., col] = values; static shapes (one-hot select)."""
  length = ids.shape[-1]
  hot = tf.equal(tf.range(length), col)
  return tf.where(hot, values[..., tf.newaxis], ids)


def length_penalty(length, alpha: float):
  """GNMT length normalizer ((5 + length) / 6) ** alpha."""
  return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _flatten(x):
  """[B, K, ...] -> [B*K, ...]."""
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _unflatten(x, batch_size, beam: int):
  """[B*K, ...] -> [B, K, ...]."""
  return tf.reshape(x, tf.concat([[batch_size, beam], tf.shape(x)[1:]], 0))


def tile_beams(x, beam: int):
  """[B, ...] -> [B*K, ...], each example repeated K times (encoder outputs, masks)."""
  return tf.repeat(x, beam, axis=0)


def _gather_beams(x, indices):
  """x [B, K', ...], indices [B, K] -> [B, K, ...]."""
  return tf.gather(x, indices, batch_dims=1)


def beam_search(step_fn: StepFn, cache, batch_size, beam_width: int, max_length: int,
                alpha: float, start_id: int, end_id: int, pad_id: int = 0):
  """Beam search with a length penalty.

  Args:
    cache: dict of [B*K, ...] tensors (already tiled per beam).
  Returns:
    ids [B, K, max_length] int32 best first (pad_id after [END]), scores [B, K] float32
    (length-normalized log-probs; the alive score when nothing finished).
  """
  k = beam_width
  seqs = tf.fill([batch_size, k, max_length + 1], tf.constant(pad_id, tf.int32))
  seqs = _write_column(seqs, 0, tf.fill([batch_size, k], tf.constant(start_id, tf.int32)))
  # Only beam 0 is live at first, so the K beams do not start as K copies.
  alive_lp = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch_size, 1])
  fin_seqs = seqs
  fin_scores = tf.fill([batch_size, k], NEG_INF)
  fin_flags = tf.zeros([batch_size, k], tf.bool)
  max_lp = length_penalty(max_length, alpha)

  def cond(i, seqs, alive_lp, fin_seqs, fin_scores, fin_flags, cache):
    del seqs, fin_seqs, cache
    # The best alive hypothesis can at most keep its log-prob and get the largest penalty.
    best_alive = alive_lp[:, 0] / max_lp
    worst_fin = tf.where(tf.reduce_any(fin_flags, 1),
                         tf.reduce_min(tf.where(fin_flags, fin_scores, -NEG_INF), 1), NEG_INF)
    done = tf.reduce_all(tf.logical_and(tf.reduce_all(fin_flags, 1), worst_fin > best_alive))
    return tf.logical_and(i < max_length, tf.logical_not(done))

  def body(i, seqs, alive_lp, fin_seqs, fin_scores, fin_flags, cache):
    ids = _flatten(seqs[:, :, i:i + 1])  # [B*K, 1]
    logits, cache = step_fn(ids, i, cache)
    vocab = tf.shape(logits)[-1]
    log_probs = _unflatten(tf.nn.log_softmax(logits), batch_size, k)  # [B, K, V]
    cand_lp = tf.reshape(log_probs + alive_lp[:, :, tf.newaxis], [batch_size, -1])  # [B, K*V]
    top_lp, top_idx = tf.math.top_k(cand_lp, k=2 * k)  # [B, 2K]
    top_beam, top_tok = top_idx // vocab, top_idx % vocab
    top_seqs = _write_column(_gather_beams(seqs, top_beam), i + 1, top_tok)  # [B, 2K, L+1]
    ended = tf.equal(top_tok, end_id)

    # Alive: the best K candidates that did not end.
    alive_cand = tf.where(ended, NEG_INF, top_lp)
    alive_lp, keep = tf.math.top_k(alive_cand, k=k)
    seqs = _gather_beams(top_seqs, keep)
    src_beam = _gather_beams(top_beam, keep)  # [B, K] which old beam each new one extends
    flat_src = tf.reshape(src_beam + tf.range(batch_size)[:, tf.newaxis] * k, [-1])
    cache = tf.nest.map_structure(lambda t: tf.gather(t, flat_src), cache)

    # Finished: candidates that ended among the top K (as fairseq: an [END] outside the beam
    # is not a hypothesis the beam holds; this makes width 1 exactly greedy), merged with the
    # ones kept so far.
    ended_in_beam = tf.logical_and(ended, tf.range(2 * k)[tf.newaxis, :] < k)
    new_scores = tf.where(ended_in_beam, top_lp / length_penalty(i + 1, alpha), NEG_INF)
    all_seqs = tf.concat([fin_seqs, top_seqs], 1)
    all_scores = tf.concat([fin_scores, new_scores], 1)
    all_flags = tf.concat([fin_flags, ended_in_beam], 1)
    fin_scores, keep = tf.math.top_k(all_scores, k=k)
    fin_seqs = _gather_beams(all_seqs, keep)
    fin_flags = _gather_beams(all_flags, keep)
    return i + 1, seqs, alive_lp, fin_seqs, fin_scores, fin_flags, cache

  state = [tf.constant(0), seqs, alive_lp, fin_seqs, fin_scores, fin_flags, cache]
  _, seqs, alive_lp, fin_seqs, fin_scores, fin_flags, _ = tf.while_loop(
      cond, body, state,
      shape_invariants=[tf.TensorShape([])] + [tf.TensorShape(t.shape) for t in state[1:6]]
      + [tf.nest.map_structure(lambda t: t.shape, cache)],
      maximum_iterations=max_length)
  # An example with no finished hypothesis returns its alive ones.
  any_fin = tf.reduce_any(fin_flags, axis=1)
  ids = tf.where(any_fin[:, tf.newaxis, tf.newaxis], fin_seqs, seqs)[:, :, 1:]
  scores = tf.where(any_fin[:, tf.newaxis], fin_scores, alive_lp / max_lp)
  # Tokens after the first [END] become padding.
  alive = tf.math.cumprod(tf.cast(tf.not_equal(ids, end_id), tf.int32), axis=-1, exclusive=True)
  ids = tf.where(tf.cast(alive, tf.bool), ids, pad_id)
  return ids, scores
