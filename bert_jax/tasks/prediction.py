"""Prediction with a task model: its deterministic forward pass and the run over all examples.

`predict_step` is the function `finetune.compile_steps` (and `bert_jax.extract_features`) jit;
`predict` feeds it every example in global batches (`batching.local_batches`, with dynamic padding:
longest first) and returns the outputs in the examples' order.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import numpy as np

from bert_jax.training import sharding, summaries
from bert_jax.tasks.batching import FIXED, Padding, local_batches
from bert_jax.training.steps import global_batch

# The model inputs of every task, int32 [N, L] (SWAG [N, 4, L]), in the order the task models take them.
INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def predict_step(params: Any, batch: Mapping[str, jax.Array], *, model: nn.Module) -> Any:
    """Deterministic forward pass -> the model's output dataclass (float32 logits)."""
    with sharding.axis_rules():
        return model.apply({"params": params}, *(batch[k] for k in INPUT_NAMES), deterministic=True)


def _pad_like(x: np.ndarray, like: jax.ShapeDtypeStruct) -> np.ndarray:
    """`x` zero-padded at the end of every axis shorter than `like`'s (a bucket-length output back to L)."""
    widths = [(0, full - size) for size, full in zip(x.shape, like.shape)]
    return np.pad(x, widths) if any(w for _, w in widths) else x


def predict(predict_fn: Callable, params: Any, arrays: Mapping[str, np.ndarray], *, batch_size: int, mesh,
            desc: str = "predicting", padding: Padding = FIXED) -> Any:
    """Runs `predict_fn` over all rows of `arrays` -> the outputs' leaves as numpy [N, ...], row i the
    output of example i whatever order the batches ran in.

    `arrays` needs input_ids, token_type_ids, attention_mask int32 [N, L] (SWAG [N, 4, L]; other keys
    are ignored); the result is the model's output dataclass with numpy leaves, e.g. float32 [N, L]
    span logits. The last batch is padded and the padding rows dropped. With `padding.buckets` the
    examples run longest first, each batch cut to its bucket length; outputs with a sequence axis
    (found by `jax.eval_shape` at length L, e.g. NER's float32 [N, L, C] logits) come back at length L,
    zeros past each batch's bucket (padding positions, meaningless in either mode).

    Raises:
      ValueError: batch_size not divisible by the process count (`local_batches`).
      KeyError: one of INPUT_NAMES missing from `arrays`.
      TypeError: `arrays` with no rows (nothing to concatenate).
    """
    inputs = {k: arrays[k] for k in INPUT_NAMES}
    n = len(inputs["input_ids"])
    chunks, indices, full = [], [], None
    is_main = jax.process_index() == 0
    progress = summaries.progress_bar(0, -(-n // batch_size), is_main, desc)
    with jax.set_mesh(mesh):
        for local, real, rows in local_batches(inputs, batch_size, seed=None, drop_remainder=False, padding=padding):
            out = jax.device_get(predict_fn(params, global_batch(local, mesh, tuple(local))))
            if padding.buckets:
                if full is None:  # the output shapes at length L (traced, not compiled)
                    full = jax.eval_shape(predict_fn, params, {k: jax.ShapeDtypeStruct(
                        (batch_size,) + v.shape[1:], v.dtype) for k, v in inputs.items()})
                out = jax.tree_util.tree_map(_pad_like, out, full)
            chunks.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[:real], out))
            indices.append(rows)
            progress.update(1)
    progress.close()
    result = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *chunks)
    order = np.concatenate(indices)
    if np.array_equal(order, np.arange(n)):
        return result
    inverse = np.argsort(order)
    return jax.tree_util.tree_map(lambda x: x[inverse], result)
