"""SWAG fine-tuning config: `get_config(size)`; size names the architecture for random init (tiny | mini |
small | base | large, default base); with config.init_checkpoint the architecture comes from the
checkpoint and only the compute options of config.model apply.

  python -m bert_jax.tasks.swag --config swag \\
      --config.init_checkpoint=/path/to/bert --config.data_dir=/path/to/swagaf/data --workdir /tmp/swag

Defaults are the paper's SWAG recipe (section 4.4): 3 epochs, learning rate 2e-5, batch size 16; the
rest as run_classifier.py's fine-tuning (warmup_proportion 0.1, weight decay 0.01). max_seq_length 128
holds nearly every SWAG context + ending (the paper does not give one; transformers' SWAG example runs
with 80). Data: the official train.csv / val.csv / test.csv (rowanz/swagaf `data/`), not in TFDS.
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.configs.pretrain import model_config


def get_config(arg: str = "base") -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.model = model_config(arg or "base")  # architecture for random init; compute options always
    config.init_checkpoint = ""  # "" random | Hugging Face directory | bert_jax pre-training workdir
    config.vocab_file = ""  # WordPiece vocabulary ("" = init_checkpoint's vocab.txt)
    config.do_lower_case = config_dict.placeholder(bool)  # None: the init_checkpoint's casing, else True
    config.data_dir = ""  # folder of the official SWAG CSV files
    config.train_file = "train.csv"  # labelled: fine-tune on it
    config.dev_file = "val.csv"  # labelled: accuracy (the paper's Dev column)
    config.test_file = "test.csv"  # unlabelled: predicted with do_predict
    config.do_predict = False  # also write <workdir>/test_predictions.csv for test_file
    config.max_train_examples = 0  # train only on the first N training examples (0 = all)
    config.max_seq_length = 128  # tokens per choice sequence
    # Dynamic padding (batching.Padding): each batch padded to its longest sequence rounded up to a
    # bucket length (one compiled program per length): at most max_length_buckets multiples of
    # length_buckets tokens, placed where the training batches' lengths waste the fewest padded tokens
    # (batching.placed_buckets; max_length_buckets=0: every multiple); length_buckets=0: every batch at
    # max_seq_length (fixed padding)
    config.length_buckets = 1
    config.max_length_buckets = 12
    # a bucket is placed only if it saves this many padded example positions (each 4 tokens, one per
    # choice): one program's compile time over one token's training time (the ratio measured in
    # benchmarks/README.md, over 4; 0: max_length_buckets alone)
    config.bucket_program_tokens = 2_500.0
    config.group_by_length = True  # training batches from length-sorted chunks of 50 batches (transformers')
    # the optimizer update as one program shared by every bucket length (steps.SharedUpdateStep): each
    # bucket compiles only its forward and backward pass (false: one whole-step program per bucket)
    config.shared_update = True
    config.train_batch_size = 16  # paper: 16 (examples, each of 4 sequences)
    config.eval_batch_size = 64
    config.learning_rate = 2e-5  # paper: 2e-5
    config.num_train_epochs = 3.0  # paper: 3
    config.warmup_proportion = 0.1  # linear warmup over this share of the steps, then linear decay to 0
    config.weight_decay = 0.01  # AdamW, not on LayerNorm and biases
    config.seed = 0
    config.log_every = 50  # steps between TensorBoard / console metrics
    config.save_checkpoint = True  # write the fine-tuned state to <workdir>/checkpoints
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=0))
    return config
