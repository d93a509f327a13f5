"""The BERT model in Flax linen: encoder, pre-training heads and fine-tuning heads.

Architecture as in Devlin et al. 2018 (arXiv 1810.04805, section 3) and google-research/bert
`modeling.py`: learned absolute position and token-type embeddings, post-LayerNorm Transformer layers
with exact (erf) GELU, a tanh pooler on [CLS], a masked-LM head tied to the word embeddings and
evaluated only at `masked_lm_positions`, and a next-sentence head on the pooled output.

Dimension key used in shapes and einsum strings:
  B batch, L sequence length, D hidden_size, N num_attention_heads, H head size (D / N),
  I intermediate_size, V vocab_size, P max predictions per sequence, T type_vocab_size,
  S max_position_embeddings, C number of classes.

Sharding: every parameter is created with logical axis names (`nn.with_logical_partitioning`) and
activations are constrained at block boundaries (`nn.with_logical_constraint`). Both are no-ops unless
`bert_jax.sharding` supplies a mesh and a rules table; the model never names a mesh axis.

Logical axis names: parameters use `vocab`, `embed`, `embed_out` (output side of a D x D kernel),
`heads`, `kv`, `mlp`, `position`, `token_type`,
`classes` and (scanned layers) `layers`; activations use `batch`, `length`, `embed`, `heads`, `kv`,
`mlp`, `predictions`.

Precision: parameters are stored in `param_dtype` (float32 by default) and cast to `dtype` for
matmuls; attention softmax, LayerNorm statistics and the MLM logits are always float32.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax import kernels

Array = jax.Array

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@jax.custom_vjp
def gelu(x: Array) -> Array:
    """Exact (erf) GELU, x * Phi(x), as the original and Hugging Face's "gelu"; any shape, dtype kept.

    Computed in float32 for any input dtype. The gradient is written out, g * (Phi(x) + x * phi(x)),
    one elementwise pass over the saved input. With autodiff of `jax.nn.gelu(approximate=False)`
    instead, XLA CPU ran the BERT-Base feed-forward block's forward and backward about 6% slower
    (141 against 132 ms). Tests check the value and the gradient against jax.nn.gelu with autodiff
    and against torch.nn.functional.gelu.
    """
    x32 = x.astype(jnp.float32)
    return (x32 * _normal_cdf(x32)).astype(x.dtype)


def _normal_cdf(x: Array) -> Array:
    """Phi(x) = (1 + erf(x / sqrt(2))) / 2, the form of torch.nn.functional.gelu."""
    return 0.5 + 0.5 * jax.lax.erf(x * _SQRT_HALF)


def _gelu_fwd(x):
    return gelu(x), x


def _gelu_bwd(x, g):
    # The barrier keeps XLA from sharing erf(x / sqrt 2) with the forward pass: shared, it was written
    # to memory in the forward and read back here, two extra passes over the [B*L, I] activations.
    x32 = jax.lax.optimization_barrier(x).astype(jnp.float32)
    pdf = jnp.exp(-0.5 * x32 * x32) * _INV_SQRT_2PI
    return ((g.astype(jnp.float32) * (_normal_cdf(x32) + x32 * pdf)).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": gelu,  # exact erf GELU, as the original
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}

_REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

# bert_config.json fields, in the original's order.
BERT_CONFIG_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
)


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Model hyper-parameters, named as in the original `bert_config.json`.

    The first twelve fields are those of `bert_config.json` (google-research/bert) and of Hugging Face's
    `BertConfig`; defaults are BERT-Base. The rest choose how the same model is computed:

    Attributes:
      dtype: compute dtype name for matmuls and activations, "float32" or "bfloat16".
      param_dtype: storage dtype name of the parameters (float32 by default).
      scan_layers: stack the layers under `nn.scan` (parameters get a leading `layers` axis of length
        num_hidden_layers); compiles 24 layers as fast as one.
      remat_policy: activation rematerialisation of each layer: "none", "full", "dots" or
        "dots_no_batch" (a `jax.checkpoint_policies` policy).

    Raises:
      ValueError: at construction, for hidden_size not divisible by num_attention_heads, an unknown
        hidden_act or remat_policy, a dtype or param_dtype that is not a floating-point dtype name,
        or a non-positive size.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    kernels: str = "auto"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"BertConfig.{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"BertConfig.hidden_act={self.hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")
        kernels.resolve(self.kernels, "cpu")  # raises on an unknown name
        if self.remat_policy not in _REMAT_POLICIES:
            raise ValueError(
                f"BertConfig.remat_policy={self.remat_policy!r} is not one of {sorted(_REMAT_POLICIES)}")
        for name in ("dtype", "param_dtype"):
            value = getattr(self, name)
            try:
                floating = jnp.issubdtype(jnp.dtype(value), jnp.floating)
            except TypeError:  # an unknown dtype name
                floating = False
            if not isinstance(value, str) or not floating:
                raise ValueError(f"BertConfig.{name}={value!r} is not a floating-point dtype name "
                                 "(e.g. 'float32', 'bfloat16')")

    @property
    def head_size(self) -> int:
        """H = hidden_size // num_attention_heads, the width of one attention head (exact: construction
        checks that num_attention_heads divides hidden_size)."""
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], **overrides) -> "BertConfig":
        """Builds a config from a `bert_config.json` / Hugging Face `config.json` mapping.

        Unknown keys (e.g. `architectures`, `model_type`, `pad_token_id`) are ignored; `overrides`
        replace fields (e.g. `dtype="bfloat16"`).

        Raises:
          ValueError: a value the constructor rejects (see the class), or a size that `int()` cannot
            parse (e.g. "x").
          TypeError: an override that is not a BertConfig field, or a size that `int()` cannot take
            (e.g. None).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str, **overrides) -> "BertConfig":
        """Reads a `bert_config.json` (or Hugging Face `config.json`) file; `overrides` as `from_dict`.

        Raises:
          FileNotFoundError: no file at `path` (other `OSError`s as `open`).
          ValueError: the file is not UTF-8 (`UnicodeDecodeError`) or not JSON (`json.JSONDecodeError`);
            the errors of `from_dict`.
          TypeError: as `from_dict`.
          AttributeError: JSON whose top level is not an object.
        """
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f), **overrides)

    def to_dict(self) -> dict[str, Any]:
        """The twelve `bert_config.json` fields, as a plain dict."""
        return {k: getattr(self, k) for k in BERT_CONFIG_FIELDS}

    def replace(self, **changes) -> "BertConfig":
        """A copy with `changes` applied (`dataclasses.replace`), validated again by the constructor.

        Raises:
          ValueError: a changed value the constructor rejects (see the class).
          TypeError: a name that is not a BertConfig field.
        """
        return dataclasses.replace(self, **changes)


@flax.struct.dataclass
class BertOutput:
    """Outputs of `BertModel`.

    Attributes:
      sequence_output: [B, L, D] in config.dtype, the last layer's hidden states.
      pooled_output: [B, D] in config.dtype, tanh(dense(sequence_output[:, 0])); None without pooler.
    """

    sequence_output: Array
    pooled_output: Array | None


@flax.struct.dataclass
class PreTrainingOutput:
    """Outputs of `BertForPreTraining`.

    Attributes:
      mlm_logits: [B, P, V] float32, masked-LM logits at `masked_lm_positions` only.
      nsp_logits: [B, 2] float32, next-sentence logits (index 0 = IsNext, 1 = NotNext).
      sequence_output: [B, L, D], pooled_output: [B, D], as in `BertOutput`.
    """

    mlm_logits: Array
    nsp_logits: Array
    sequence_output: Array
    pooled_output: Array


@flax.struct.dataclass
class SpanOutput:
    """Outputs of `BertForQuestionAnswering`: start_logits, end_logits, each [B, L] float32."""

    start_logits: Array
    end_logits: Array


@flax.struct.dataclass
class ClassificationOutput:
    """Outputs of `BertForSequenceClassification`: logits [B, C] float32."""

    logits: Array


def _init(config: BertConfig) -> Callable:
    # The original's tf.truncated_normal_initializer(stddev=initializer_range): cut at 2 stddev,
    # no variance correction (jax.nn.initializers.truncated_normal does the same).
    return jax.nn.initializers.truncated_normal(stddev=config.initializer_range)


def _param(module: nn.Module, name: str, init: Callable, shape: tuple[int, ...], axes: tuple[str, ...]):
    """Creates a parameter of `module` with logical axis names `axes`, in config.param_dtype."""
    return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                        jnp.dtype(module.config.param_dtype))


class LayerNorm(nn.Module):
    """LayerNorm over the last axis (`embed`), with parameters `scale` [D] and `bias` [D].

    y = (x - mean) / sqrt(var + layer_norm_eps) * scale + bias, statistics in float32 with the exact
    two-pass variance (as torch.nn.LayerNorm and the original's tf.contrib LayerNorm); x [..., D] in any
    dtype -> y [..., D] in config.dtype. Why not `flax.linen.LayerNorm` (same formula, same parameter
    names): on XLA CPU its gradient materialised the scale broadcast to [B, L, D] in every layer, and the
    train step ran 4.7% (mini) and 2.8% (BERT-Base) slower with it (in-process A/B, medians of
    alternating windows).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """x [..., D] in any dtype -> [..., D] in config.dtype, normalised over the last axis.

        Creates `scale` (ones) and `bias` (zeros), [D] in config.param_dtype, on init.

        Raises:
          flax.errors.ScopeParamShapeError: x's last axis differs from the existing parameters' D.
        """
        features = x.shape[-1]
        scale = _param(self, "scale", nn.initializers.ones, (features,), ("embed",))
        bias = _param(self, "bias", nn.initializers.zeros, (features,), ("embed",))
        x32 = x.astype(jnp.float32)
        centred = x32 - x32.mean(axis=-1, keepdims=True)
        variance = (centred * centred).mean(axis=-1, keepdims=True)
        y = centred * jax.lax.rsqrt(variance + self.config.layer_norm_eps)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(jnp.dtype(self.config.dtype))


class Dense(nn.Module):
    """y = x @ kernel + bias over the last axis, kernel [D_in, D_out] with logical axis names.

    Attributes:
      config: model config (initializer, dtypes).
      features: D_out.
      axes: logical names of the kernel's two axes; the bias takes the second.
      transpose_input_for_grad: compute the kernel gradient as x^T @ dy with x^T written out once
        (`dense_transposed_input_grad`); worth it where D_in is much narrower than D_out (the
        feed-forward block's first layer).
    """

    config: BertConfig
    features: int
    axes: tuple[str, str]
    transpose_input_for_grad: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        """x: [..., D_in] -> [..., D_out] in config.dtype."""
        dtype = jnp.dtype(self.config.dtype)
        kernel = _param(self, "kernel", _init(self.config), (x.shape[-1], self.features), self.axes)
        bias = _param(self, "bias", nn.initializers.zeros, (self.features,), self.axes[1:])
        x, kernel, bias = x.astype(dtype), kernel.astype(dtype), bias.astype(dtype)
        if self.transpose_input_for_grad:
            return dense_transposed_input_grad(x, kernel, bias)
        return jnp.dot(x, kernel) + bias


@jax.custom_vjp
def dense_transposed_input_grad(x: Array, kernel: Array, bias: Array) -> Array:
    """x [..., D_in] @ kernel [D_in, D_out] + bias [D_out], one dtype; the same value as the plain form.

    The gradient is written out so that the kernel gradient multiplies a transposed copy of the input,
    x^T [D_in, N] @ dy [N, D_out], held apart from the forward by an optimization barrier. Left to
    itself, XLA CPU transposed the wider dy [N, D_out] instead (and kept the narrow x as is); in the
    feed-forward block's first layer (D_out = 4 D_in) this made the whole train step 4-7% slower on
    `mini` and about 6% slower on BERT-Base (in-process A/B, medians of alternating windows). Tests
    check all three gradients against autodiff of the plain form.
    """
    return jnp.dot(x, kernel) + bias


def _dense_fwd(x, kernel, bias):
    return dense_transposed_input_grad(x, kernel, bias), (x, kernel)


def _dense_bwd(residuals, dy):
    x, kernel = residuals
    flat_x = x.reshape(-1, x.shape[-1])  # [N, D_in]
    flat_dy = dy.reshape(-1, dy.shape[-1])  # [N, D_out]
    x_t = jax.lax.optimization_barrier(flat_x.T)  # [D_in, N], materialised once
    dkernel = jnp.dot(x_t, flat_dy, preferred_element_type=jnp.float32).astype(kernel.dtype)
    dbias = flat_dy.astype(jnp.float32).sum(axis=0).astype(kernel.dtype)
    return jnp.dot(dy, kernel.T), dkernel, dbias


dense_transposed_input_grad.defvjp(_dense_fwd, _dense_bwd)


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings -> LayerNorm -> dropout (paper figure 2)."""

    config: BertConfig

    def setup(self):
        c = self.config
        self.word_embeddings = nn.Embed(
            c.vocab_size, c.hidden_size, dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.param_dtype),
            embedding_init=nn.with_logical_partitioning(_init(c), ("vocab", "embed")))
        self.position_embeddings = nn.Embed(
            c.max_position_embeddings, c.hidden_size, param_dtype=jnp.dtype(c.param_dtype),
            embedding_init=nn.with_logical_partitioning(_init(c), ("position", "embed")))
        self.token_type_embeddings = nn.Embed(
            c.type_vocab_size, c.hidden_size, param_dtype=jnp.dtype(c.param_dtype),
            embedding_init=nn.with_logical_partitioning(_init(c), ("token_type", "embed")))
        self.layer_norm = LayerNorm(c, name="LayerNorm")
        self.dropout = Dropout(c.hidden_dropout_prob)

    def __call__(self, input_ids: Array, token_type_ids: Array, deterministic: bool) -> Array:
        """input_ids, token_type_ids: int32 [B, L] -> embeddings [B, L, D] in config.dtype.

        Args:
          input_ids: int32 [B, L] WordPiece ids in [0, V); L <= max_position_embeddings.
          token_type_ids: int32 [B, L] segment ids in [0, T).
          deterministic: disables dropout when True.

        Positions are 0..L-1 (the first L rows of the [S, D] table). Nothing is checked here (the
        ValueError checks are `BertModel`'s): an id >= V (or type >= T) gives a NaN row (`jnp.take`'s
        default "fill" mode) and a negative one (>= -V) counts from the end of the table.

        Raises:
          TypeError: L > max_position_embeddings, or token_type_ids whose shape does not broadcast to
            input_ids' (jax broadcasting).
          flax.errors.InvalidRngError: deterministic False without a "dropout" PRNG stream.
        """
        length = input_ids.shape[1]
        # Sum in param_dtype (float32) so bfloat16 compute loses nothing before the LayerNorm.
        words = jnp.take(self.word_embeddings.embedding, input_ids, axis=0)  # [B, L, D]
        positions = self.position_embeddings.embedding[:length][None]  # [1, L, D]
        types = jnp.take(self.token_type_embeddings.embedding, token_type_ids, axis=0)  # [B, L, D]
        x = self.layer_norm(words + positions + types)
        x = self.dropout(x, deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))

    def attend(self, x: Array, bias: Array | None = None) -> Array:
        """Tied output projection: x [..., D] -> float32 logits [..., V] = x @ word_embeddings^T (+ bias [V])."""
        table = self.word_embeddings.embedding
        bias = jnp.zeros(table.shape[:1], jnp.float32) if bias is None else bias
        return tied_logits(x, table, bias, jnp.dtype(self.config.dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def tied_logits(x: Array, table: Array, bias: Array, dtype: jnp.dtype) -> Array:
    """x [..., D] @ table [V, D]^T + bias [V] -> float32 [..., V]; x and table cast to `dtype` (compute).

    The gradient is written out for XLA CPU, where the head's non-matmul work dominated it: d bias is
    a matrix-vector product (ones @ d logits) instead of a reduction over the [N, V] cotangent, which
    XLA CPU ran several times slower; d table = (x^T @ d logits)^T transposes the [D, V] result rather
    than the [N, V] cotangent. Tests check all three gradients against autodiff of the plain einsum.
    """
    return jnp.einsum("...d,vd->...v", x.astype(dtype), table.astype(dtype),
                      preferred_element_type=jnp.float32) + bias.astype(jnp.float32)


def _tied_logits_fwd(x, table, bias, dtype):
    return tied_logits(x, table, bias, dtype), (x, table, bias)


def _tied_logits_bwd(dtype, residuals, dlogits):
    x, table, bias = residuals
    d32 = dlogits.reshape(-1, dlogits.shape[-1])  # [N, V] float32
    d = d32.astype(dtype)
    flat_x = x.reshape(-1, x.shape[-1]).astype(dtype)  # [N, D]
    dx = jnp.einsum("nv,vd->nd", d, table.astype(dtype), preferred_element_type=jnp.float32)
    dtable = jnp.einsum("nd,nv->dv", flat_x, d, preferred_element_type=jnp.float32).T  # [V, D]
    dbias = jnp.ones(d32.shape[:1], jnp.float32) @ d32  # [V]
    return dx.reshape(x.shape).astype(x.dtype), dtable.astype(table.dtype), dbias.astype(bias.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


def _fmix32(h: Array) -> Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def dropout_keep_mask(rng: Array, shape: tuple[int, ...], rate: float) -> tuple[Array, float]:
    """Keep mask of inverted dropout from a counter-based hash -> (bool mask of `shape`, keep probability).

    Two 32-bit seeds are drawn from `rng` (any PRNG key); element i of the mask hashes its index:
    h = fmix32(fmix32(lead ^ s0) ^ (inner * 0x9E3779B9 + s1)), with `lead` the index over the leading
    dims and `inner` over the last two, and the element is kept when the top 16 bits of h are at least
    round(rate * 65536). The keep probability is therefore 1 - round(rate * 65536) / 65536 (0.8999939
    for rate 0.1). Why not `nn.Dropout`: on CPU, drawing one PRNG number per element (threefry or
    RngBitGenerator) costs about 10x more than these fused integer operations, and for the attention
    probabilities [B, N, L, L] that made dropout slower than the matmuls. The mask depends only on the
    key and the global index, so it is the same under any sharding.
    """
    seeds = jax.random.bits(rng, (2,), jnp.uint32)
    lead = math.prod(shape[:-2]) if len(shape) > 2 else 1
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape[-2:]
    outer = jax.lax.broadcasted_iota(jnp.uint32, (lead, 1, 1), 0)
    inner = (jax.lax.broadcasted_iota(jnp.uint32, (1, rows, cols), 1) * jnp.uint32(cols)
             + jax.lax.broadcasted_iota(jnp.uint32, (1, rows, cols), 2))
    h = _fmix32(_fmix32(outer ^ seeds[0]) ^ (inner * jnp.uint32(0x9E3779B9) + seeds[1]))
    threshold = round(rate * 65536)
    return ((h >> 16) >= threshold).reshape(shape), 1.0 - threshold / 65536


class Dropout(nn.Module):
    """Inverted dropout (drops with probability `rate`, scales the rest by 1 / keep probability) on the
    "dropout" PRNG stream, with the hashed mask of `dropout_keep_mask`; identity when deterministic."""

    rate: float

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        """x: any shape, floating dtype -> same shape and dtype; x itself when deterministic or rate 0.

        Raises (only when applied, i.e. not deterministic and rate > 0):
          flax.errors.InvalidRngError: no "dropout" PRNG stream (`rngs={"dropout": key}`).
          ValueError: a 0-d x (the mask is indexed over the last two axes).
          ZeroDivisionError: a rate so close to 1 that nothing is kept (round(rate * 65536) == 65536).
        """
        if deterministic or self.rate == 0.0:
            return x
        keep, keep_prob = dropout_keep_mask(self.make_rng("dropout"), x.shape, self.rate)
        return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros((), x.dtype))


class BertSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention with the padding mask, then the output projection."""

    config: BertConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array, mask_bias: Array) -> Array:
        """x: [B, L, D]; mask_bias: float32 [B, 1, 1, L] (0 real key, very negative padding) -> [B, L, D].

        Scaled dot-product attention (Vaswani et al. 2017, section 3.2): softmax(q k^T / sqrt(H) + mask_bias) v
        per head. x (any float dtype) is cast to config.dtype; scores and softmax are float32; the output is
        in config.dtype. mask_bias may be any shape that broadcasts to the scores [B, N, L, L].

        Raises (no ValueError: inputs are checked by `BertModel`):
          TypeError: x's last axis is not hidden_size (reshape), or mask_bias does not broadcast to
            [B, N, L, L].
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        c = self.config
        dtype = jnp.dtype(c.dtype)
        n, h, d = c.num_attention_heads, c.head_size, c.hidden_size
        init = _init(c)

        batch, length = x.shape[:2]
        tokens = x.reshape(batch * length, d).astype(dtype)  # [B*L, D]

        # Projections are plain 2-D matmuls over the flattened tokens with the [D, N, H] kernels viewed
        # as [D, N*H] (a free reshape), then one transpose to heads-major [B, N, L, H]. Written as one
        # einsum "bld,dnh->bnlh", XLA CPU instead copied transposed kernels and activations around every
        # projection (about 280 ms of copy and transpose fusions in a BERT-Base train step's profile).
        def project(name):  # -> [B, N, L, H]
            kernel = _param(self, f"{name}_kernel", init, (d, n, h), ("embed", "heads", "kv"))
            bias = _param(self, f"{name}_bias", nn.initializers.zeros, (n, h), ("heads", "kv"))
            y = jnp.dot(tokens, kernel.reshape(d, n * h).astype(dtype)) + bias.reshape(n * h).astype(dtype)
            y = y.reshape(batch, length, n, h).transpose(0, 2, 1, 3)
            return nn.with_logical_constraint(y, ("batch", "heads", "length", "kv"))

        query, key, value = project("query"), project("key"), project("value")
        # Scores and softmax in float32 whatever the compute dtype. Plain batched matmuls over [B, N]
        # are ~3x faster than the equivalent einsum on XLA CPU (benchmarks/train_step.py).
        scores = jnp.matmul(query, jnp.swapaxes(key, -1, -2), preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(h) + mask_bias  # [B, N, L, L]
        probs = jax.nn.softmax(scores, axis=-1)
        probs = Dropout(c.attention_probs_dropout_prob)(probs, deterministic=self.deterministic)
        context = jnp.matmul(probs.astype(dtype), value)  # [B, N, L, H]
        context = nn.with_logical_constraint(context, ("batch", "heads", "length", "kv"))
        context = context.transpose(0, 2, 1, 3).reshape(batch * length, n * h)  # [B*L, N*H]
        out_kernel = _param(self, "output_kernel", init, (n, h, d), ("heads", "kv", "embed"))
        out_bias = _param(self, "output_bias", nn.initializers.zeros, (d,), ("embed",))
        out = jnp.dot(context, out_kernel.reshape(n * h, d).astype(dtype)) + out_bias.astype(dtype)
        out = out.reshape(batch, length, d)
        return out  # [B, L, D]


class BertLayer(nn.Module):
    """One post-LayerNorm Transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    `__call__` returns `(hidden, None)` so that the same module runs under `nn.scan`.
    """

    config: BertConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: Array, mask_bias: Array) -> tuple[Array, None]:
        """x: [B, L, D]; mask_bias: float32 [B, 1, 1, L] -> ([B, L, D], None)."""
        c = self.config
        drop = lambda y: Dropout(c.hidden_dropout_prob)(y, deterministic=self.deterministic)
        attn = BertSelfAttention(c, self.deterministic, name="attention")(x, mask_bias)
        x = LayerNorm(c, name="attention_LayerNorm")(x + drop(attn))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        y = Dense(c, c.intermediate_size, ("embed", "mlp"), transpose_input_for_grad=True, name="intermediate")(x)
        y = _ACTIVATIONS[c.hidden_act](y)
        y = nn.with_logical_constraint(y, ("batch", "length", "mlp"))  # [B, L, I]
        y = Dense(c, c.hidden_size, ("mlp", "embed"), name="output")(y)
        x = LayerNorm(c, name="output_LayerNorm")(x + drop(y))
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class BertEncoder(nn.Module):
    """The stack of `num_hidden_layers` layers: `layer_{i}` each, or one scanned `layers` stack."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: Array, mask_bias: Array, deterministic: bool = True) -> Array:
        """x: [B, L, D]; mask_bias: float32 [B, 1, 1, L] -> [B, L, D]."""
        c = self.config
        layer_cls = BertLayer
        policy = _REMAT_POLICIES[c.remat_policy]
        if c.remat_policy != "none":
            layer_cls = nn.remat(BertLayer, policy=policy, prevent_cse=not c.scan_layers)
        if c.scan_layers:
            stack = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,),
                length=c.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(c, deterministic, name="layers")(x, mask_bias)
            return x
        for i in range(c.num_hidden_layers):
            x, _ = layer_cls(c, deterministic, name=f"layer_{i}")(x, mask_bias)
        return x


def attention_mask_bias(attention_mask: Array) -> Array:
    """int [B, L] (1 real, 0 padding) -> float32 [B, 1, 1, L] additive bias (0 or float32 min)."""
    return jnp.where(attention_mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)


def _check_inputs(config: BertConfig, input_ids: Array, token_type_ids, attention_mask):
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {input_ids.shape}")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(
            f"input_ids length {input_ids.shape[1]} exceeds max_position_embeddings="
            f"{config.max_position_embeddings}")
    for name, value in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
        if value is not None and value.shape != input_ids.shape:
            raise ValueError(f"{name} shape {value.shape} differs from input_ids shape {input_ids.shape}")


class BertModel(nn.Module):
    """The BERT encoder: embeddings, `num_hidden_layers` layers and the pooler.

    Applied as `model.apply({"params": params}, input_ids=..., token_type_ids=..., attention_mask=...,
    deterministic=True)`; dropout needs `rngs={"dropout": key}` when `deterministic=False`.
    Matches Hugging Face `transformers.BertModel` (see `bert_jax.convert.from_hf`).
    """

    config: BertConfig
    add_pooling_layer: bool = True

    def setup(self):
        c = self.config
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        if self.add_pooling_layer:
            self.pooler = Dense(c, c.hidden_size, ("embed", "embed_out"))

    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> BertOutput:
        """Encodes a batch.

        Args:
          input_ids: int32 [B, L] WordPiece ids, L <= max_position_embeddings.
          token_type_ids: int32 [B, L], 0 sentence A, 1 sentence B; zeros when None.
          attention_mask: int32 [B, L], 1 real token, 0 padding; all ones when None.
          deterministic: disables dropout when True.

        Returns:
          BertOutput with sequence_output [B, L, D] and pooled_output [B, D] (config.dtype).

        Raises:
          ValueError: for a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes.
        """
        _check_inputs(self.config, input_ids, token_type_ids, attention_mask)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        x = self.embeddings(input_ids, token_type_ids, deterministic)
        x = self.encoder(x, attention_mask_bias(attention_mask), deterministic)
        pooled = jnp.tanh(self.pooler(x[:, 0])) if self.add_pooling_layer else None
        return BertOutput(sequence_output=x, pooled_output=pooled)

    def attend(self, x: Array, bias: Array | None = None) -> Array:
        """Tied word-embedding projection, x [..., D] -> float32 [..., V] (+ bias float [V])."""
        return self.embeddings.attend(x, bias)


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, D], positions int32 [B, P] -> [B, P, D] (the original's gather_indexes).

    The dtype of `sequence` is kept. Position values are not checked and never raise: with
    `jnp.take_along_axis`'s default "fill" mode a position in [-L, 0) counts from the end, and one
    >= L or < -L gives a NaN row (the dtype's minimum for an integer sequence).

    Raises:
      IndexError: 1-D positions.
      ValueError: a batch size of positions that neither equals nor broadcasts to B.
    """
    return jnp.take_along_axis(sequence, positions[:, :, None].astype(jnp.int32), axis=1)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads (paper section 3.1, appendix A.2).

    The MLM head (dense -> activation -> LayerNorm -> tied decoder + output bias) runs only at
    `masked_lm_positions`, as the original's `get_masked_lm_output`, never over all L positions.
    """

    config: BertConfig

    def setup(self):
        c = self.config
        self.bert = BertModel(c, name="bert")
        self.mlm_transform = Dense(c, c.hidden_size, ("embed", "embed_out"), name="mlm_transform")
        self.mlm_layer_norm = LayerNorm(c, name="mlm_LayerNorm")
        self.nsp = Dense(c, 2, ("embed", "classes"), name="nsp")
        self.mlm_output_bias = _param(self, "mlm_output_bias", nn.initializers.zeros, (c.vocab_size,),
                                      ("vocab",))

    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, masked_lm_positions: Array | None = None,
                 deterministic: bool = True) -> PreTrainingOutput:
        """Pre-training forward pass.

        Args:
          input_ids, token_type_ids, attention_mask: int32 [B, L], as `BertModel`.
          masked_lm_positions: int32 [B, P], positions in [0, L) to predict (zero padded).
          deterministic: disables dropout when True.

        Returns:
          PreTrainingOutput: mlm_logits float32 [B, P, V], nsp_logits float32 [B, 2], and the encoder
          outputs.

        Raises:
          ValueError: masked_lm_positions missing or not [B, P]; the errors of `BertModel`.
        """
        if masked_lm_positions is None or masked_lm_positions.ndim != 2:
            raise ValueError("masked_lm_positions must be given as int32 [batch, max_predictions]")
        out = self.bert(input_ids, token_type_ids, attention_mask, deterministic)
        return PreTrainingOutput(
            mlm_logits=self.mlm_logits(out.sequence_output, masked_lm_positions),
            nsp_logits=self.nsp(out.pooled_output).astype(jnp.float32),
            sequence_output=out.sequence_output,
            pooled_output=out.pooled_output,
        )

    def mlm_logits(self, sequence_output: Array, masked_lm_positions: Array) -> Array:
        """sequence_output [B, L, D], masked_lm_positions int32 [B, P] -> float32 logits [B, P, V]."""
        c = self.config
        x = gather_positions(sequence_output, masked_lm_positions)  # [B, P, D]
        x = nn.with_logical_constraint(x, ("batch", "predictions", "embed"))
        x = self.mlm_layer_norm(_ACTIVATIONS[c.hidden_act](self.mlm_transform(x)))
        logits = self.bert.attend(x, self.mlm_output_bias)
        return nn.with_logical_constraint(logits, ("batch", "predictions", "vocab"))


class BertForQuestionAnswering(nn.Module):
    """BERT with the SQuAD span head: a [D, 2] projection giving start and end logits per token."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> SpanOutput:
        """int32 [B, L] inputs -> SpanOutput(start_logits, end_logits), each float32 [B, L].

        Arguments as `BertModel.__call__`; the span head of the paper's section 4.2 (SQuAD).

        Raises:
          ValueError: a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes
            (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        out = BertModel(self.config, add_pooling_layer=False, name="bert")(
            input_ids, token_type_ids, attention_mask, deterministic)
        logits = Dense(self.config, 2, ("embed", "classes"), name="qa_outputs")(out.sequence_output)
        logits = logits.astype(jnp.float32)  # [B, L, 2]
        return SpanOutput(start_logits=logits[..., 0], end_logits=logits[..., 1])


class BertForSequenceClassification(nn.Module):
    """BERT with a classifier on the pooled output (dropout -> [D, C] projection), as GLUE in the paper."""

    config: BertConfig
    num_labels: int = 2

    @nn.compact
    def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
                 attention_mask: Array | None = None, deterministic: bool = True) -> ClassificationOutput:
        """int32 [B, L] inputs -> ClassificationOutput(logits float32 [B, C]), C = num_labels.

        Arguments as `BertModel.__call__`; the classifier of the paper's section 4.1 (GLUE).

        Raises:
          ValueError: a non-2-D input_ids, a length over max_position_embeddings or mismatched shapes
            (`BertModel`).
          flax.errors.InvalidRngError: deterministic=False without a "dropout" PRNG stream.
        """
        out = BertModel(self.config, name="bert")(input_ids, token_type_ids, attention_mask, deterministic)
        pooled = Dropout(self.config.hidden_dropout_prob)(out.pooled_output, deterministic=deterministic)
        logits = Dense(self.config, self.num_labels, ("embed", "classes"), name="classifier")(pooled)
        return ClassificationOutput(logits=logits.astype(jnp.float32))
