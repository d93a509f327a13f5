"""Pre-training configs: `get_config("tiny" | "mini" | "small" | "base" | "large" | "transfer" | "demo")`.

Launch (from the project root), e.g.:
  python -m bert_jax.train --config pretrain:tiny --workdir /tmp/run \\
      --config.phases[0].data_dir=data/p1 --config.phases[1].data_dir=data/p2
Model fields are named as in `bert_config.json`; `bert_jax.model.modeling.BertConfig.from_dict(config.model)`
turns them into the model's arguments (model code never sees a ConfigDict).

Sizes (L layers, H hidden, A heads): tiny 2/128/2 (CPU tests), mini 4/256/4, small 4/512/8,
base 12/768/12 (paper: 110M parameters), large 24/1024/16 (paper: 340M). Vocab 30522, 512 positions.

Recipes measured on this project's 2-core CPU (docs/transfer-findings.md):
  transfer  tiny, the recipe whose encoder fine-tunes SQuAD better than random init within benchmarks/
            transfer.py's budget (not SST-2 on 2,000 sentences; set model.vocab_size and the phases' data_dir);
  demo      the same recipe shortened to the few minutes of `make demo`.
"""

import ml_collections

_SIZES = {
    # name: (num_hidden_layers, hidden_size, num_attention_heads)
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def model_config(size: str) -> ml_collections.ConfigDict:
    """The `bert_config.json` fields of a named size, plus compute options."""
    if size not in _SIZES:
        raise ValueError(f"config arg {size!r} is not one of {sorted(_SIZES) + list(RECIPES)}")
    layers, hidden, heads = _SIZES[size]
    return ml_collections.ConfigDict(dict(
        vocab_size=30522,  # Google's uncased WordPiece vocabulary
        hidden_size=hidden,  # D
        num_hidden_layers=layers,  # L
        num_attention_heads=heads,  # A; head size D / A = 64 for all but tiny
        intermediate_size=4 * hidden,  # feed-forward size, 4D as in the paper
        hidden_act="gelu",  # exact erf GELU
        hidden_dropout_prob=0.1,  # paper: dropout 0.1 on all layers
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=512,  # learned absolute positions
        type_vocab_size=2,  # sentence A / B
        initializer_range=0.02,  # truncated normal stddev
        layer_norm_eps=1e-12,
        dtype="auto",  # compute dtype: auto = bfloat16 on GPUs and TPUs, float32 on CPUs
        param_dtype="float32",  # parameters stay float32
        scan_layers=False,  # nn.scan over layers (fast compile of deep models)
        remat_policy="none",  # none | full | dots | dots_no_batch
        kernels="auto",  # auto | reference | xla_cpu | tpu | splash | gpu (bert_jax.model.kernels; auto: xla_cpu on CPU,
        # tpu on TPU, gpu on GPU)
    ))


def phase(max_seq_length: int, max_predictions_per_seq: int, fraction: float, data_dir: str,
          batch_size: int, packing: bool = False, masked_lm_prob: float = 0.15, do_whole_word_mask: bool = False,
          short_seq_prob: float = 0.1) -> ml_collections.ConfigDict:
    """One pre-training phase's fields (`bert_jax.training.pretraining.resolve_phases` checks them). The instance and masking
    fields carry create_pretraining_data.py's flag names and defaults: tokenized documents draw instances with
    them; static instances were written with fixed ones, which must equal these (a one-line error names the
    field otherwise)."""
    return ml_collections.ConfigDict(dict(
        max_seq_length=max_seq_length,  # sequence length of this phase's instances
        max_predictions_per_seq=max_predictions_per_seq,  # masked positions per sequence, at most
        masked_lm_prob=masked_lm_prob,  # share of an instance's tokens masked (round(n * p), at least 1)
        do_whole_word_mask=do_whole_word_mask,  # mask all WordPieces of a word together (Google's later models)
        short_seq_prob=short_seq_prob,  # probability of a short target length, uniform in [2, max_seq_length - 3]
        fraction=fraction,  # share of total_steps spent in this phase
        data_dir=data_dir,  # create_pretraining_data output: instances, or documents (--tokenize_only)
        batch_size=batch_size,  # global batch, rows (sequences; packed: rows of several instances)
        # Pack several instances per row (Krell et al. 2021; bert_jax.data.pretraining.packing): attention within each
        # instance, positions restarting, NSP at each [CLS]; the same loss per instance as unpacked.
        packing=packing,
        max_instances=0,  # instances per packed row, K (0: max(2, max_seq_length // 32))
        # With packing and tokenized documents: rows with >= 32 free tokens get instances drawn to fit
        # (bert_jax.data.pretraining.dynamic.FillRows: short documents leave gaps that no instance of the stream fills).
        fill_rows=True,
        grad_accum_steps=0,  # micro-batches per optimizer step in this phase (0: config.grad_accum_steps)
    ))


RECIPES = ("transfer", "demo")


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
    if arg in RECIPES:
        return _recipe(arg)
    config = ml_collections.ConfigDict()
    config.model = model_config(arg)
    config.seed = 0  # PRNG seed: init, dropout (folded with the step) and data shuffling
    # Continue pre-training from existing weights (the original's --init_checkpoint): a bert_jax run or one of
    # its checkpoints, a Hugging Face directory, a google-research/bert TF checkpoint. The architecture comes
    # from there; step, optimizer and data start fresh; a workdir with checkpoints resumes and ignores it.
    config.init_checkpoint = ""
    config.total_steps = 1_000_000  # optimizer steps over both phases (paper: 1M)
    config.warmup_steps = 10_000  # linear warmup, then linear decay to 0 (paper)
    config.optimizer = "adamw"  # adamw (paper) or lamb (large batches)
    config.learning_rate = 1e-4  # peak learning rate (paper)
    config.weight_decay = 0.01  # decoupled, not on LayerNorm and biases (paper)
    config.adam_b1 = 0.9
    config.adam_b2 = 0.999
    config.adam_eps = 1e-6
    config.max_grad_norm = 1.0  # global-norm clipping (original)
    # MLM output bias at the start: "zeros" (original) or "log_prior", the log unigram distribution of
    # the first phase's masked targets (the head starts at the context-free optimum; docs/transfer-findings.md)
    config.mlm_bias_init = "zeros"
    config.grad_accum_steps = 1  # micro-batches per optimizer step (a phase's own grad_accum_steps overrides it)
    # Two phases in one run (paper, appendix A.2): length 128 for 90% of the steps, then 512 for 10%.
    config.phases = [phase(128, 20, 0.9, "data/phase1", 256), phase(512, 80, 0.1, "data/phase2", 256)]
    # grain worker processes per host decoding instances, or drawing them from tokenized documents (0: the
    # training process's threads); the batches are the same for any count, a run resumes with its own
    config.data_workers = 0
    # Held-out evaluation (bert_jax.training.evaluation), one of: a directory of static instances or of tokenized documents
    # (instances drawn with each phase's length and masking), or a share of the phases' tokenized documents that
    # training never reads (bert_jax.data.pretraining.holdout). Neither: no evaluation.
    config.eval_data_dir = ""  # held-out instances or documents ("" = none)
    config.eval_fraction = 0.0  # share of each phase's tokenized documents held out, in (0, 1) (0 = none)
    config.eval_every = 10_000  # steps between evaluations
    config.eval_batches = 20  # batches per evaluation
    config.mesh = ml_collections.ConfigDict(dict(
        preset="",  # a sharding.MESH_PRESETS name (e.g. "v3-32"), or "" to use the sizes below
        data=-1,  # data-parallel ways (-1: all remaining devices)
        fsdp=1,  # fully-sharded data-parallel ways
        tensor=1,  # tensor-parallel ways
        num_devices=0,  # use the first N devices (0 = all), e.g. 1 to debug on one CPU device
    ))
    config.log_every = 100  # steps between metrics (TensorBoard and console)
    config.checkpoint_every = 10_000  # steps between checkpoints (also at the phase switch and the end)
    config.keep_checkpoints = 3  # newest checkpoints kept
    # One run per workdir (bert_jax.training.guards.lease): a second run stops while this one's lease is fresh; a lease whose
    # heartbeat is older than lease_timeout_s (a crashed run elsewhere) is taken over. Seconds; 0: the defaults,
    # 300 and 30 (lease.TIMEOUT_S, lease.HEARTBEAT_S).
    config.lease_timeout_s = 0.0
    config.lease_heartbeat_s = 0.0
    # A bad step (a non-finite loss or gradient norm; a loss over the running mean by spike_sigmas running standard
    # deviations, after warmup_steps steps of a phase) restores the newest checkpoint and skips the batches drawn since
    # it (bert_jax.training.guards.rollback); more than max_rollbacks within window_steps steps, or enabled=False: the run
    # stops in one line. checkpoint_every bounds how far back a rollback goes.
    config.rollback = ml_collections.ConfigDict(dict(enabled=True, spike_sigmas=6.0, warmup_steps=100, ema_decay=0.99,
                                                     max_rollbacks=3, window_steps=2000))
    # Every phase's train step compiled before step 0 and checked against the memory a device may use, so that a
    # phase that does not fit stops the run at its start: "auto" (on GPUs and TPUs), "always", "never".
    config.precompile = "auto"
    config.device_memory_gib = 0.0  # memory a device may use, GiB (0: the allocator's limit; none on a CPU)
    config.peak_tflops_per_device = 0.0  # MFU's peak per device; 0 = a known TPU's bf16 peak, else no MFU
    if arg == "tiny":
        config.total_steps = 200
        config.warmup_steps = 20
        config.learning_rate = 1e-3
        config.phases = [phase(64, 10, 0.9, "data/phase1", 32), phase(128, 20, 0.1, "data/phase2", 32)]
        config.log_every = 10
        config.checkpoint_every = 50
        config.eval_every = 100
        config.eval_batches = 4
    return config


def _recipe(name: str) -> ml_collections.ConfigDict:
    """A tiny-model pre-training recipe for transfer on a CPU budget (module docstring)."""
    config = get_config("tiny")
    config.mlm_bias_init = "log_prior"
    config.learning_rate = 1e-3
    config.total_steps = 12_000 if name == "transfer" else 600
    config.warmup_steps = config.total_steps // 20
    config.phases = [phase(128, 20, 0.9, "data/phase1", 64), phase(256, 40, 0.1, "data/phase2", 32)]
    config.log_every = 100 if name == "transfer" else 10
    config.checkpoint_every = 2000 if name == "transfer" else config.total_steps
    return config
