"""GLUE fine-tuning config: `get_config(task)` with task mrpc (default) or sst2.

  python -m bert_jax.tasks.glue --config configs/glue.py:mrpc \\
      --config.init_checkpoint=/path/to/minilm --config.data_dir=../shared/data/glue/MRPC --workdir /tmp/mrpc

Defaults are google-research/bert run_classifier.py's (max_seq_length 128, train_batch_size 32,
learning_rate 5e-5, 3 epochs, warmup_proportion 0.1). Architecture for random init: config.model
(base); with config.init_checkpoint it comes from the checkpoint.
"""

import ml_collections

from configs.pretrain import model_config

_DATA = {"mrpc": "MRPC", "sst2": "SST-2"}


def get_config(arg: str = "mrpc") -> ml_collections.ConfigDict:
    task = arg or "mrpc"
    if task not in _DATA:
        raise ValueError(f"config arg {task!r} is not one of {sorted(_DATA)}")
    config = ml_collections.ConfigDict()
    config.task = task
    config.model = model_config("base")  # architecture for random init; compute options always
    config.init_checkpoint = ""  # "" random | Hugging Face directory | bert_jax pre-training workdir
    config.vocab_file = ""  # WordPiece vocabulary ("" = the Hugging Face directory's vocab.txt)
    config.do_lower_case = True
    config.data_dir = f"../shared/data/glue/{_DATA[task]}"  # train.tsv and dev.tsv in GLUE format
    config.max_train_examples = 0  # train only on the first N training examples (0 = all)
    config.use_tfds = False  # read TFDS glue/<task> instead (prepared beforehand; never downloads here)
    config.tfds_data_dir = ""
    config.max_seq_length = 128
    config.train_batch_size = 32
    config.eval_batch_size = 64
    config.learning_rate = 5e-5
    config.num_train_epochs = 3.0
    config.warmup_proportion = 0.1
    config.weight_decay = 0.01
    config.seed = 0
    config.log_every = 50
    config.save_checkpoint = True
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=0))
    return config
