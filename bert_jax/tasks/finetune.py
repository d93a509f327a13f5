"""Fine-tuning machinery shared by the task jobs: initial weights, sharded state, steps, batching, the loop.

Initial weights (`config.init_checkpoint`, paper section 4: the pre-trained encoder, fresh task head):
whatever `bert_jax.initialisation.resolve` reads (a Hugging Face directory, a google-research/bert
TensorFlow checkpoint, a bert_jax run or one of its checkpoints; "" for random initialisation), the
architecture from the source, the compute options and dropout from this job's `config.model`. The
vocabulary and casing are the source's (its vocab.txt and tokenizer_config.json) unless config.vocab_file /
config.do_lower_case name them, which must then agree.

Mesh, optimizer, sharded state, train step and timer are `bert_jax.engine`'s, as in pre-training: the
state is built sharded (`jax.eval_shape` -> logical partition specs -> `jax.jit(..., out_shardings=...)`)
and the task's loss goes through `engine.train_step`, jitted with explicit shardings and donation.
Batches are assembled from each process's rows of one global permutation with
`jax.make_array_from_process_local_data`, so several hosts read disjoint rows.

Dynamic padding (`Padding`, from a config's `length_buckets` / `group_by_length`: on in the GLUE, NER and
SWAG configs, absent from SQuAD's, whose windows are full by construction): `fit` and `predict` cut each
batch to its longest sequence rounded up to a bucket length (`bucket_lengths`), so a step function
compiles one program per bucket used; training batches may come length-grouped (transformers'
`group_by_length`); `predict` runs the examples longest first and returns its outputs in their order.
length_buckets=0 gives the fixed-length batches (every batch at max_seq_length) exactly.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
from typing import Any, Callable, Iterator, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import checkpointing, engine, errors, initialisation, modeling, sharding, storage, summaries
from bert_jax.data.tokenization import Tokenizer
from bert_jax.engine import TrainState, global_batch

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


def data_file(config: ml_collections.ConfigDict, name: str) -> str:
    """`config.data_dir`/`name`, the path of one of a task's files.

    Raises:
      ValueError: config.data_dir is empty (one line: the job has no default data folder).
    """
    if not config.data_dir:
        raise ValueError(f"config.data_dir is empty: name the folder that holds {name}")
    return storage.join(config.data_dir, name)


def load_tokenizer(config: ml_collections.ConfigDict, init: initialisation.Initialisation) -> Tokenizer:
    """The WordPiece tokenizer of the job: config.vocab_file and config.do_lower_case when set, else the
    source's (`initialisation.vocabulary`), checked against the encoder.

    Raises:
      ValueError: no vocabulary, or one / a casing that conflicts with the source's (`vocabulary`); a
        vocabulary with more tokens than the model's vocab_size (its ids would index past the embeddings).
      FileNotFoundError: the vocabulary file does not exist.
    """
    vocab_file, do_lower_case = initialisation.vocabulary(init, config.vocab_file, config.get("do_lower_case"))
    tokenizer = Tokenizer(vocab_file, do_lower_case=do_lower_case)
    if tokenizer.vocab_size > init.config.vocab_size:
        raise ValueError(f"vocabulary {tokenizer.vocab_file} has {tokenizer.vocab_size} tokens, more than the model's "
                         f"vocab_size {init.config.vocab_size}")
    return tokenizer


def load_encoder(config: ml_collections.ConfigDict) -> tuple[initialisation.Initialisation, Tokenizer]:
    """What every task job starts from: `initialisation.resolve` of config.init_checkpoint (its
    architecture, the job's compute options) and `load_tokenizer`, with config.max_seq_length checked
    against the encoder's positions.

    Raises:
      the errors of `initialisation.resolve` and `load_tokenizer`;
      ValueError: a batch size (config.*_batch_size) below 1 or a negative config.num_train_epochs (checked
        first); config.max_seq_length over the encoder's max_position_embeddings; an architecture field set
        on the command line that conflicts with the init_checkpoint's (`check_explicit_fields`).
    """
    for name in sorted(k for k in config.keys() if k.endswith("_batch_size")):
        if config[name] < 1:
            raise ValueError(f"config.{name}={config[name]} must be at least 1")
    if config.get("num_train_epochs", 0) < 0:
        raise ValueError(f"config.num_train_epochs={config.num_train_epochs} must be non-negative")
    init = initialisation.resolve(config.init_checkpoint, config.model)
    if init.kind != "random":
        initialisation.check_explicit_fields(config, init.config, config.init_checkpoint)
    tokenizer = load_tokenizer(config, init)
    if config.max_seq_length > init.config.max_position_embeddings:
        raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds max_position_embeddings="
                         f"{init.config.max_position_embeddings}")
    return init, tokenizer


def create_state(model: nn.Module, tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                 init: initialisation.Initialisation, seed: int, seq_length: int = 8) -> tuple[TrainState, Any]:
    """The sharded TrainState of `model` (a BertFor... task model with an encoder named "bert"), its
    encoder taken from `init` (`initialisation.load_params` of the "bert/..." parameters; a pooler the
    source lacks, and the task head, as initialised with `seed`), and the tree of NamedShardings
    (`engine.state_shardings`).

    Raises:
      ValueError: a parameter or optimizer-state dimension the mesh does not divide
        (`sharding.check_divisible`); a source without a matching encoder (`load_params`).
      FileNotFoundError / ValueError: from Orbax when the checkpoint does not hold a matching encoder.
    """
    ids = jnp.zeros((1, seq_length), jnp.int32)
    state_init = engine.state_init(model, tx, seed, ids, ids, ids)
    abstract, shardings = engine.state_shardings(state_init, mesh)
    sharding.check_divisible(abstract, shardings)
    # The optimizer state starts at zero whatever the params: built with the random ones, kept.
    state = engine.create_state(state_init, mesh, shardings)
    params, _ = initialisation.load_params(init, state.params, shardings.params, mesh,
                                           take=lambda path: path.startswith("bert/"))
    return state.replace(params=params), shardings


TaskLoss = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]


def task_loss(params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array, denominators=None, *,
              model: nn.Module, loss_fn: TaskLoss) -> tuple[jax.Array, dict]:
    """The `engine.LossFn` of a task: `model` on INPUT_NAMES (int32 [B, L]) with dropout, then
    `loss_fn(outputs, batch)` -> (sum, count) -> float32 scalar sum / count (sum / denominators when
    given: the whole batch's row count under accumulation), and no further metrics."""
    out = model.apply({"params": params}, *(batch[k] for k in INPUT_NAMES), deterministic=False,
                      rngs={"dropout": dropout_rng})
    total, count = loss_fn(out, batch)
    return total / (jnp.maximum(count, 1.0) if denominators is None else denominators), {}


def predict_step(params: Any, batch: Mapping[str, jax.Array], *, model: nn.Module) -> Any:
    """Deterministic forward pass -> the model's output dataclass (float32 logits)."""
    with sharding.axis_rules():
        return model.apply({"params": params}, *(batch[k] for k in INPUT_NAMES), deterministic=True)


def compile_steps(model, tx, schedule, mesh, shardings, loss_fn: TaskLoss,
                  shared_update: bool = False) -> tuple[Callable, Callable]:
    """(train_step, predict_step) jitted with explicit shardings (`engine.jit_train_step`, state donated).

    Args:
      shardings: the TrainState tree of NamedShardings from `create_state`.
      loss_fn: (model outputs, batch) -> (float32 sum of the per-example losses, float32 count).
      shared_update: the optimizer update as one program for every batch shape
        (`engine.SharedUpdateStep`; config.shared_update of the GLUE, NER and SWAG jobs).

    The train step's metrics: loss (sum / count), grad_norm, learning_rate, float32 scalars. Every batch
    array (inputs [B, L], labels [B] or [B, ...]) is sharded over its rows (data, fsdp).

    Raises:
      ValueError: a mesh without the "data" and "fsdp" axes (from `NamedSharding`). Nothing is
        compiled here: jax traces and compiles on the first call, and raises there for a batch whose keys
        or shapes do not fit these shardings.
    """
    step = engine.jit_train_step(functools.partial(task_loss, model=model, loss_fn=loss_fn), tx, schedule, mesh,
                                 shardings, shared_update=shared_update)
    predict = engine.jit_eval_step(functools.partial(predict_step, model=model), mesh, shardings.params)
    return step, predict


def create_optimizer(config: ml_collections.ConfigDict, num_train_steps: int):
    """AdamW as the original's fine-tuning (`optimization.create_optimizer`): linear warmup over
    warmup_proportion of the steps, linear decay to 0, weight decay 0.01, clipping at 1.0
    (`engine.create_optimizer` over max(num_train_steps, 1) steps)."""
    return engine.create_optimizer(config, max(num_train_steps, 1))


# ----------------------------------------------------------------------------- batching and dynamic padding

# Batches per length-sorted chunk under group_by_length: transformers' LengthGroupedSampler mega-batch (50).
GROUP_SIZE = 50


def bucket_lengths(max_seq_length: int, multiple: int) -> tuple[int, ...]:
    """The padded lengths a batch may have: the multiples of `multiple` below max_seq_length, then
    max_seq_length itself, e.g. (8, 16, ..., 120, 128) for (128, 8); () for multiple 0 (fixed padding:
    every batch at max_seq_length).

    The trade-off: at fine-tuning lengths a step's time is close to linear in the padded length (the
    projections and feed-forward dominate attention's L^2 part), so the waste to minimise is padded
    tokens, and each bucket used costs one compilation per step function, once per run (README, Dynamic
    padding, has the timings).
    Length-grouped SST-2 epochs (batch 32, MiniLM's vocabulary) hold these padded tokens (real: 897k of
    the full set, 107k of its first 8000):

      spacing                      full set    first 8000    buckets used on the full set (possible)
      fixed (length_buckets=0)     8.62M       1024k          1 (1)
      exact longest (no buckets)   0.94M        112k         55 (128)
      multiples of 8               1.16M        138k          9 (16)
      multiples of 16              1.48M        176k          5 (8)
      powers of 2 (8 ... 128)      1.32M        157k          5 (5)
      multiples of 32              2.29M        272k          3 (4)
      spacing 1, 12 placed         1.01M                     12 (`placed_buckets`, the configs' default)
      spacing 1, 16 placed         0.99M                     16

    Fixed multiples waste most where most sentences are (multiples of 16 pad SST-2's mean of ~13 tokens
    by up to 15); buckets placed on the run's own batch lengths (`Padding.placed`, the configs'
    `max_length_buckets`) spend the same number of programs where the batches are: 12 placed ones hold
    13% fewer tokens than the 9 multiples of 8 used. A spacing of 8 or 16 keeps every length a multiple
    of it (TPU sublanes, GPU tensor-core tiles), at the price of more padding.

    Args:
      max_seq_length: int, the features' full length L (>= 1).
      multiple: int >= 0, the spacing in tokens.

    Returns:
      ascending tuple of ints, the last one max_seq_length; () when multiple is 0.

    Raises:
      ValueError: multiple < 0 or max_seq_length < 1.
    """
    if multiple < 0 or max_seq_length < 1:
        raise ValueError(f"length_buckets={multiple} / max_seq_length={max_seq_length}: need length_buckets >= 0 "
                         "and max_seq_length >= 1")
    if multiple == 0:
        return ()
    return tuple(range(multiple, max_seq_length, multiple)) + (max_seq_length,)


def placed_buckets(batch_lengths: np.ndarray, rows: np.ndarray | int, candidates: tuple[int, ...],
                   count: int, program_tokens: float = 0.0) -> tuple[int, ...]:
    """At most `count` of the `candidates` lengths, chosen so that batches of these longest sequences hold
    the fewest padded tokens: sum over batches of rows * (smallest chosen length >= its longest), plus
    `program_tokens` per length chosen, minimal (exact dynamic programming over the candidates,
    O(count * K^2) for K candidates used).

    Args:
      batch_lengths: int [M], each batch's longest sequence (`sequence_lengths` of its rows, max).
      rows: int [M] or a scalar, the batches' row counts (the token cost of a length per batch).
      candidates: ascending ints, the lengths allowed (`bucket_lengths`); the last >= every batch length.
      count: int >= 1.
      program_tokens: float >= 0, the padded tokens one more length (one more compiled program) must
        save to be chosen: its compile time in units of one token's training time. 0: only `count` limits.

    Returns:
      ascending tuple of at most `count` candidates, the last the smallest candidate >= every batch's
      length; () for no batches.

    Raises:
      ValueError: count < 1, program_tokens < 0, or a batch longer than every candidate.
    """
    if count < 1:
        raise ValueError(f"max_length_buckets={count}: need >= 1")
    if program_tokens < 0:
        raise ValueError(f"bucket_program_tokens={program_tokens}: need >= 0")
    batch_lengths = np.asarray(batch_lengths)
    if not batch_lengths.size:
        return ()
    used = np.unique(bucket_of(batch_lengths, candidates))  # a best choice uses only lengths some batch needs
    weight = np.zeros(len(used))
    np.add.at(weight, np.searchsorted(used, bucket_of(batch_lengths, candidates)),
              np.broadcast_to(np.asarray(rows, np.float64), batch_lengths.shape))
    below = np.concatenate([[0.0], np.cumsum(weight)])  # below[j]: rows of batches needing used[< j]
    k = len(used)
    # cost[c, j]: least tokens of the batches needing used[<= j] with c + 1 lengths, the largest used[j]
    cost = np.full((min(count, k), k), np.inf)
    back = np.zeros(cost.shape, np.int64)
    cost[0] = used * below[1:]
    for c in range(1, len(cost)):
        for j in range(c, k):
            options = cost[c - 1, :j] + used[j] * (below[j + 1] - below[1:j + 1])
            back[c, j] = int(np.argmin(options))
            cost[c, j] = options[back[c, j]]
    c = int(np.argmin(cost[:, -1] + program_tokens * np.arange(1, len(cost) + 1)))
    chosen, j = [], k - 1
    while c >= 0:
        chosen.append(int(used[j]))
        j, c = back[c, j], c - 1
    return tuple(sorted(chosen))


def sequence_lengths(attention_mask: np.ndarray) -> np.ndarray:
    """int64 [N]: per example 1 + the position of its last attended token (0 when it has none), the
    longest of its sequences for [N, ..., L] masks (SWAG's [N, 4, L]: the longest choice). Cutting the
    sequence axis there drops padding only, even for a mask with holes."""
    mask = np.asarray(attention_mask) != 0
    full = mask.shape[-1]
    last = np.where(mask.any(-1), full - np.argmax(mask[..., ::-1], axis=-1), 0)
    return last.reshape(len(mask), -1).max(axis=1)


def bucket_of(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
    """int [...]: the smallest bucket >= each length.

    Raises:
      ValueError: a length over the largest bucket.
    """
    lengths = np.asarray(lengths)
    if lengths.size and lengths.max() > buckets[-1]:
        raise ValueError(f"sequence of {lengths.max()} tokens is longer than the largest length bucket {buckets[-1]}")
    return np.asarray(buckets)[np.searchsorted(buckets, lengths, side="left")]


@dataclasses.dataclass(frozen=True)
class Padding:
    """How `fit` and `predict` pad each batch along the sequence axis (the inputs' last axis, L).

    Attributes:
      buckets: ascending lengths (`bucket_lengths`). Empty (the default): fixed padding, every batch at
        the arrays' full length L, exactly the batches of a job without dynamic padding. Otherwise each
        batch is cut to the smallest bucket >= its longest sequence (`sequence_lengths` of the global
        batch, so every process cuts alike; L itself is always a bucket, buckets over L are ignored):
        a step function compiles at most one program per bucket. Attention masks make the cut padding
        inert: per-example outputs equal the full-length ones (float rounding aside).
      group_by_length: (with buckets) training batches come from length-sorted chunks of `group_size`
        batches of each epoch's seeded permutation (transformers' `group_by_length` /
        LengthGroupedSampler), then the batch order is shuffled with the same seed; sequences of a batch
        have similar lengths, so little padding is left. Without it, training batches are the fixed
        mode's rows, only cut. `predict` sorts by length whenever buckets are set and returns the
        outputs in the arrays' order.
      group_size: batches per sorted chunk (transformers' mega-batch multiplier, 50).
      max_buckets: 0, or at most this many bucket lengths, placed on the training batches by `placed`
        (`placed_buckets`: the fewest padded tokens for that many compiled programs).
      program_tokens: (with max_buckets) the padded tokens one more bucket must save to be placed (its
        program's compile time over one token's training time), so short runs build fewer programs.
    """

    buckets: tuple[int, ...] = ()
    group_by_length: bool = False
    group_size: int = GROUP_SIZE
    max_buckets: int = 0
    program_tokens: float = 0.0

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "Padding":
        """config.length_buckets (int spacing in tokens, 0 = fixed; `bucket_lengths`),
        config.max_length_buckets (int, 0 = every multiple of the spacing; else at most that many, placed
        by `placed` on the training set), config.bucket_program_tokens (float, `placed_buckets`'
        program_tokens) and config.group_by_length (bool) over config.max_seq_length; fixed for a config
        without them (SQuAD).

        Raises:
          ValueError: a negative length_buckets, max_length_buckets or bucket_program_tokens.
        """
        buckets = bucket_lengths(config.max_seq_length, config.get("length_buckets", 0))
        max_buckets = config.get("max_length_buckets", 0)
        if max_buckets < 0:
            raise ValueError(f"max_length_buckets={max_buckets}: need >= 0 (0: every multiple of length_buckets)")
        program_tokens = float(config.get("bucket_program_tokens", 0.0))
        if program_tokens < 0:
            raise ValueError(f"bucket_program_tokens={program_tokens}: need >= 0")
        return cls(buckets, bool(config.get("group_by_length", False)) and bool(buckets),
                   max_buckets=max_buckets if buckets else 0, program_tokens=program_tokens if buckets else 0.0)

    def placed(self, arrays: Mapping[str, np.ndarray], batch_size: int, seed: int, num_steps: int) -> "Padding":
        """With max_buckets, the padding whose buckets are at most max_buckets of these, placed on the
        batches `fit(arrays, batch_size=..., seed=..., num_train_steps=num_steps)` draws (`placed_buckets`:
        the fewest padded tokens over those steps); self otherwise. The largest bucket is the smallest
        one holding the longest training batch; longer batches (in `predict`) take the arrays' full length.
        With no training step (num_steps 0), the buckets are placed on the arrays' prediction batches
        (longest first, as `predict` runs them).
        """
        if not self.max_buckets or not self.buckets:
            return self
        lengths = sequence_lengths(arrays["attention_mask"])
        maxima, epoch = [], 0
        while len(maxima) < num_steps:
            rows = _batch_rows(len(lengths), batch_size, seed + epoch, True, self, lengths)
            if not rows:
                break
            maxima.extend(int(lengths[r].max()) for r in rows[:num_steps - len(maxima)])
            epoch += 1
        if not maxima:
            maxima = [int(lengths[r].max()) for r in _batch_rows(len(lengths), batch_size, None, False, self, lengths)]
        candidates = tuple(b for b in self.buckets if b < arrays["attention_mask"].shape[-1]) + (
            arrays["attention_mask"].shape[-1],)
        placed = placed_buckets(np.asarray(maxima, np.int64), batch_size, candidates, self.max_buckets,
                                self.program_tokens)
        return dataclasses.replace(self, buckets=placed or self.buckets)


FIXED = Padding()


def _batch_rows(n: int, global_batch_size: int, seed: int | None, drop_remainder: bool, padding: Padding,
                lengths: np.ndarray | None) -> list[np.ndarray]:
    """The global batches' row indices (each <= global_batch_size rows) in the order they run."""
    rng = None if seed is None else np.random.default_rng(seed)
    if rng is None:  # prediction: the arrays' order, or longest first (outputs put back by `predict`)
        order = np.arange(n) if lengths is None else np.argsort(-lengths, kind="stable")
    else:
        order = rng.permutation(n)
    if rng is None or lengths is None or not padding.group_by_length:
        batches = [order[start:start + global_batch_size] for start in range(0, n, global_batch_size)]
        if drop_remainder and batches and len(batches[-1]) < global_batch_size:
            batches.pop()
        return batches
    if drop_remainder:  # the same rows as the fixed mode drops
        order = order[:n - n % global_batch_size]
    chunk = padding.group_size * global_batch_size
    grouped = np.concatenate([c[np.argsort(-lengths[c], kind="stable")]
                              for c in np.split(order, range(chunk, len(order), chunk))]) if len(order) else order
    batches = [grouped[start:start + global_batch_size] for start in range(0, len(grouped), global_batch_size)]
    full = [b for b in batches if len(b) == global_batch_size]
    return [full[i] for i in rng.permutation(len(full))] + [b for b in batches if len(b) < global_batch_size]


def local_batches(arrays: Mapping[str, np.ndarray], global_batch_size: int, *, seed: int | None,
                  drop_remainder: bool, padding: Padding = FIXED
                  ) -> Iterator[tuple[dict[str, np.ndarray], int, np.ndarray]]:
    """This process's rows of each global batch -> (arrays, number of real rows in the global batch,
    int [real] the global batch's real rows as indices into `arrays`).

    `arrays` maps names to numpy arrays with a common leading axis N (e.g. int32 [N, L] inputs, int32
    [N] labels); each yielded dict has the same keys and dtypes, with leading axis
    global_batch_size // process_count.

    With seed None the order is the arrays' order (with `padding.buckets`: longest first); otherwise one
    permutation per seed (the same on every process; `padding.group_by_length` groups it by length).
    Without drop_remainder the last batch is padded with copies of its first row. With
    `padding.buckets`, every array whose leading dimensions are attention_mask's ([N, L], [N, 4, L],
    [N, L, k]: inputs, NER's per-token labels and weights) is cut to the batch's bucket length along
    attention_mask's last axis; others ([N] labels) are taken whole.

    Raises (on the first `next`, as a generator):
      ValueError: global_batch_size not divisible by the process count; buckets without an
        attention_mask array.
    """
    if global_batch_size % jax.process_count():
        raise ValueError(f"batch size {global_batch_size} is not divisible by {jax.process_count()} processes")
    n = len(next(iter(arrays.values())))
    lengths, buckets, shape = None, (), None
    if padding.buckets:
        if "attention_mask" not in arrays:
            raise ValueError("dynamic padding (length buckets) needs the attention_mask array")
        shape = arrays["attention_mask"].shape
        buckets = tuple(b for b in padding.buckets if b < shape[-1]) + (shape[-1],)
        lengths = sequence_lengths(arrays["attention_mask"])
    local = global_batch_size // jax.process_count()
    lo = jax.process_index() * local
    for rows in _batch_rows(n, global_batch_size, seed, drop_remainder, padding, lengths):
        real = len(rows)
        padded = rows if real == global_batch_size else np.concatenate([rows, np.full(global_batch_size - real,
                                                                                      rows[0])])
        mine = padded[lo:lo + local]
        if lengths is None:
            yield {k: v[mine] for k, v in arrays.items()}, real, rows
            continue
        cut = int(bucket_of(lengths[rows].max(), buckets))
        yield ({k: v[mine][..., :cut] if v.shape[:len(shape)] == shape and cut < shape[-1] else v[mine]
                for k, v in arrays.items()}, real, rows)


def _training_batches(arrays: Mapping[str, np.ndarray], batch_size: int, seed: int, num_steps: int,
                      padding: Padding) -> Iterator[dict[str, np.ndarray]]:
    """This process's batches of `fit`'s first num_steps steps: epoch e shuffled with seed + e, the
    remainder dropped (`local_batches`); fewer when an epoch holds no batch."""
    step, epoch = 0, 0
    while step < num_steps:
        drawn = 0
        for local, _, _ in local_batches(arrays, batch_size, seed=seed + epoch, drop_remainder=True, padding=padding):
            yield local
            step, drawn = step + 1, drawn + 1
            if step == num_steps:
                return
        if not drawn:
            return
        epoch += 1


def _compile_ahead(step_fn: Callable, state: TrainState, arrays: Mapping[str, np.ndarray], batch_size: int,
                   seed: int, num_steps: int, padding: Padding, mesh) -> dict[tuple[int, ...], Callable]:
    """With length buckets, step_fn compiled for each batch shape the first num_steps steps of `fit` use,
    several programs at once (XLA compiles outside the GIL, one thread per CPU): {local attention_mask
    shape: compiled step}. {} without buckets (one shape: the first call compiles it)."""
    if not padding.buckets or num_steps <= 0:
        return {}
    examples = {}
    for local in _training_batches(arrays, batch_size, seed, num_steps, padding):
        examples.setdefault(local["attention_mask"].shape, local)

    def build(local):
        with jax.set_mesh(mesh):
            return step_fn.lower(state, global_batch(local, mesh, tuple(local))).compile()

    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(examples), os.cpu_count() or 1))) as pool:
        return dict(zip(examples, pool.map(build, examples.values())))


def fit(state: TrainState, step_fn: Callable, arrays: Mapping[str, np.ndarray], *, batch_size: int,
        num_train_steps: int, seed: int, mesh, writer=None, log_every: int = 50,
        desc: str = "fine-tuning", padding: Padding = FIXED) -> tuple[TrainState, list[dict[str, float]]]:
    """Runs `num_train_steps` steps over epochs of `arrays` (reshuffled per epoch, remainder dropped).

    Args:
      step_fn: the jitted train step of `compile_steps`.
      arrays: numpy [N, ...] under exactly the step's batch keys: input_ids, token_type_ids,
        attention_mask int32 [N, L] (SWAG [N, 4, L]) and the labels (e.g. int32 [N]; NER int32 /
        float32 [N, L]), N >= batch_size.
      batch_size: global rows per step, divisible by the process count and by data * fsdp.
      seed: the shuffle of epoch e uses seed + e.
      padding: `Padding`: fixed (default) or length buckets, optionally length-grouped batches; each
        bucket length the run uses compiles step_fn once, all of them before the first step and several
        at a time (`_compile_ahead`).

    Returns the final state and the logged metrics (step, loss, grad_norm, learning_rate,
    examples_per_second) every `log_every` steps and at the end.

    Raises:
      FloatingPointError: a non-finite loss, naming the step.
      ValueError: fewer than batch_size training rows (no batch would ever form), or batch_size not
        divisible by the process count (`local_batches`).
    """
    rows = len(next(iter(arrays.values())))
    if num_train_steps > 0 and rows < batch_size:
        raise ValueError(f"{rows} training examples are fewer than one batch of train_batch_size={batch_size}")
    history = []
    is_main = jax.process_index() == 0
    step, metrics = 0, None
    with jax.set_mesh(mesh):
        programs = _compile_ahead(step_fn, state, arrays, batch_size, seed, num_train_steps, padding, mesh)
        progress = summaries.progress_bar(0, num_train_steps, is_main, desc)
        timer = engine.Chrono()
        for local in _training_batches(arrays, batch_size, seed, num_train_steps, padding):
            previous = metrics if step else None
            program = programs.get(local["attention_mask"].shape, step_fn)
            state, metrics = program(state, global_batch(local, mesh, tuple(local)))
            if previous is not None:  # one step in flight: an honest progress bar, bounded memory
                jax.block_until_ready(previous)
            step += 1
            timer.tick()
            progress.update(1)
            if step % log_every == 0 or step == num_train_steps:
                values = {k: float(v) for k, v in jax.device_get(metrics).items()}
                if not np.isfinite(values["loss"]):
                    raise FloatingPointError(f"non-finite loss {values['loss']} at fine-tuning step {step}")
                values["examples_per_second"] = timer.lap().examples_per_second(batch_size)
                summaries.write_scalars(writer, step, values, "train")
                history.append(dict(values, step=step))
                progress.set_postfix(loss=f"{values['loss']:.3f}")
    progress.close()
    return state, history


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


def save_final(workdir: str, state: TrainState, config: ml_collections.ConfigDict, bert_config: modeling.BertConfig,
               metrics: Mapping[str, float], tokenizer: Tokenizer | None = None) -> str:
    """Writes the fine-tuned state as an Orbax checkpoint `<workdir>/checkpoints/<step>` (config item:
    the job's config with the resolved model), and, with `tokenizer`, the run files that make the workdir
    an init_checkpoint or a `bert_jax.convert to_hf` input alone (`initialisation.write_run_files`:
    bert_config.json, vocab.txt, tokenizer_config.json); returns the checkpoint's path."""
    step = int(jax.device_get(state.step))
    config_json = json.loads(config.to_json())
    config_json["model"] = bert_config.to_dict()
    if tokenizer is not None and jax.process_index() == 0:
        initialisation.write_run_files(workdir, bert_config, tokenizer.vocab_file, tokenizer.do_lower_case)
    checkpointer = checkpointing.Checkpointer(storage.join(workdir, "checkpoints"), max_to_keep=1, async_save=False)
    checkpointer.save(step, state, {"metrics": dict(metrics)}, config_json)
    checkpointer.close()
    return storage.join(workdir, "checkpoints", str(step))


def finish(writer, workdir: str, state: TrainState, config: ml_collections.ConfigDict, bert_config: modeling.BertConfig,
           tokenizer: Tokenizer, scores: Mapping[str, float], metrics: dict, num_train_steps: int,
           step: int | None = None) -> None:
    """The end of every task job: `scores` to TensorBoard as "eval" (at `step`, default num_train_steps), the
    final checkpoint with the run files of `tokenizer` (`save_final`, when config.save_checkpoint and the job
    trained; its path into metrics["checkpoint"]), the writer closed (None on other processes than the
    first)."""
    if scores:
        summaries.write_scalars(writer, num_train_steps if step is None else step, scores, "eval")
    if config.save_checkpoint and num_train_steps > 0:
        metrics["checkpoint"] = save_final(workdir, state, config, bert_config, scores, tokenizer)
    if writer is not None:
        writer.close()


def cli(run: Callable[[ml_collections.ConfigDict, str], dict], name: str, config_help: str) -> None:
    """The command line of a fine-tuning job: --config (with --config.x=y overrides), --workdir and the
    multi-host flags of `bert_jax.distributed` (--jax_distributed, as launch/tpu_vm_pod.sh passes);
    prints the metrics as JSON; bad input exits with one line `<name>: <message>`."""
    from absl import app, flags, logging
    from bert_jax import configs

    from bert_jax import console, distributed

    console.install()
    configs.define_flag(config_help)
    flags.DEFINE_string("workdir", None, "Output directory: predictions, metrics, TensorBoard, checkpoint.")
    distributed.define_flags()
    flags.mark_flags_as_required(["config", "workdir"])

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments {argv[1:]}")
        logging.set_verbosity(logging.WARNING)
        try:
            storage.check_output_dir(flags.FLAGS.workdir, "--workdir")
            distributed.initialize_from_flags()
            metrics = run(configs.mark_explicit_model_fields(flags.FLAGS.config), flags.FLAGS.workdir)
        except errors.USER_ERRORS as e:
            raise errors.exit_with(name, e) from None
        if jax.process_index() == 0:
            print(json.dumps(metrics))

    app.run(main)
