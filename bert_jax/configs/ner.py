"""CoNLL-2003 NER fine-tuning config: `get_config(size)`; size names the architecture for random init
(tiny | mini | small | base | large, default base); with config.init_checkpoint the architecture comes
from the checkpoint and only the compute options of config.model apply.

  python -m bert_jax.tasks.ner --config ner \\
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/conll2003 --workdir /tmp/ner

Defaults are the paper's fine-tuning setup (appendix A.3: batch size 16 or 32, learning rate 5e-5,
3e-5 or 2e-5, 2 to 4 epochs, best on dev; section 5.3 for NER): batch 32, 3 epochs, learning rate 5e-5
(the first of LEARNING_RATES); run the others of the grid with --config.learning_rate /
--config.num_train_epochs. Warmup 0.1 and weight decay 0.01 as run_classifier.py, max_seq_length 128
(longer sentences are split between words, see bert_jax.data.ner). Google's release recommends a cased
vocabulary for NER: with a cased model set do_lower_case False. Data: train.txt / valid.txt / test.txt
in the CoNLL column format (the original eng.train / eng.testa / eng.testb are the same files; set the
names), or TFDS conll2003 with use_tfds.
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.configs.pretrain import model_config

LEARNING_RATES = (5e-5, 3e-5, 2e-5)  # the paper's fine-tuning grid (appendix A.3)
EPOCHS = (2, 3, 4)


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model = model_config(arg or "base")  # architecture for random init; compute options always
    config.init_checkpoint = ""  # "" random | Hugging Face directory | bert_jax pre-training workdir
    config.vocab_file = ""  # WordPiece vocabulary ("" = init_checkpoint's vocab.txt)
    config.do_lower_case = config_dict.placeholder(bool)  # None: the init_checkpoint's casing, else True
    config.data_dir = ""  # folder of the CoNLL-2003 files
    config.train_file = "train.txt"  # fine-tune on it; its tags are the label set
    config.dev_file = "valid.txt"  # dev_* metrics (Table 7's Dev F1); "" = none
    config.test_file = "test.txt"  # test_* metrics; "" = none
    config.use_tfds = False  # read TFDS conll2003 (train / dev / test) instead (prepared; never downloads here)
    config.tfds_data_dir = ""
    config.max_train_examples = 0  # train only on the first N training sentences (0 = all)
    config.max_seq_length = 128  # tokens per sequence; longer sentences are split between words
    # Dynamic padding (batching.Padding): each batch padded to its longest sequence rounded up to a
    # bucket length (one compiled program per length): at most max_length_buckets multiples of
    # length_buckets tokens, placed where the training batches' lengths waste the fewest padded tokens
    # (batching.placed_buckets; max_length_buckets=0: every multiple); length_buckets=0: every batch at
    # max_seq_length (fixed padding)
    config.length_buckets = 1
    config.max_length_buckets = 12
    # a bucket is placed only if it saves this many padded tokens: one program's compile time over one
    # token's training time (the ratio measured in benchmarks/README.md; 0: max_length_buckets alone)
    config.bucket_program_tokens = 10_000.0
    config.group_by_length = True  # training batches from length-sorted chunks of 50 batches (transformers')
    # the optimizer update as one program shared by every bucket length (steps.SharedUpdateStep): each
    # bucket compiles only its forward and backward pass (false: one whole-step program per bucket)
    config.shared_update = True
    config.train_batch_size = 32  # paper grid: 16, 32
    config.eval_batch_size = 64
    config.learning_rate = LEARNING_RATES[0]  # paper: best on dev of LEARNING_RATES
    config.num_train_epochs = 3.0  # paper grid: 2, 3, 4
    config.warmup_proportion = 0.1  # linear warmup over this share of the steps, then linear decay to 0
    config.weight_decay = 0.01  # AdamW, not on LayerNorm and biases
    config.seed = 0
    config.log_every = 50  # steps between TensorBoard / console metrics
    config.save_checkpoint = True  # write the fine-tuned state to <workdir>/checkpoints
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=0))
    return config
