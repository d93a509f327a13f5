"""GLUE fine-tuning config: `get_config(task)` for the nine GLUE tasks (default mrpc).

  python -m bert_jax.tasks.glue --config glue:mrpc \\
      --config.init_checkpoint=/path/to/pretrain_workdir --config.data_dir=/path/to/glue_data/MRPC --workdir /tmp/mrpc

Tasks: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli (`bert_jax.data.glue.TASKS`); data_dir is the
task's folder of a GLUE download (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI).

Defaults are the paper's GLUE recipe (section 4.1) with google-research/bert run_classifier.py's other
defaults: batch 32, 3 epochs, max_seq_length 128, warmup_proportion 0.1, learning rate 5e-5. The paper
fine-tunes with each learning rate of LEARNING_RATES and keeps the run that is best on the dev set (per
task; with several random restarts for BERT-Large on the small sets); 5e-5 is the grid's first value and
run_classifier.py's default, so run the others with --config.learning_rate. The paper leaves WNLI out
(it predicts the majority class). `do_predict` writes the GLUE-server test-set files (run_classifier.py's
flag name). Architecture for random init: config.model (base); with config.init_checkpoint it comes from
the checkpoint.
"""

import ml_collections
from ml_collections import config_dict

from bert_jax.data.glue import TASKS
from bert_jax.configs.pretrain import model_config

LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)  # the paper's fine-tuning grid for GLUE (section 4.1)


def get_config(arg: str = "mrpc") -> ml_collections.ConfigDict:
    task = arg or "mrpc"
    if task not in TASKS:
        raise ValueError(f"config arg {task!r} is not one of {sorted(TASKS)}")
    config = ml_collections.ConfigDict()
    config.task = task
    config.model = model_config("base")  # architecture for random init; compute options always
    config.init_checkpoint = ""  # "" random | Hugging Face directory | bert_jax pre-training workdir
    config.vocab_file = ""  # WordPiece vocabulary ("" = init_checkpoint's vocab.txt)
    config.do_lower_case = config_dict.placeholder(bool)  # None: the init_checkpoint's casing, else True
    # GLUE-format files: train.tsv, dev.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv), test.tsv
    # (MNLI: test_matched.tsv, test_mismatched.tsv) for do_predict
    config.data_dir = ""  # the task's folder of a GLUE download, e.g. glue_data/MRPC
    config.max_train_examples = 0  # train only on the first N training examples (0 = all)
    config.use_tfds = False  # read TFDS glue/<task> instead (prepared beforehand; never downloads here)
    config.tfds_data_dir = ""
    config.do_predict = False  # also predict the test set(s): <workdir>/submission/<GLUE name>.tsv
    # MNLI's do_predict also predicts GLUE's diagnostic set into AX.tsv (the server needs it): from
    # diagnostic_file ("" = diagnostic/diagnostic.tsv beside data_dir, the GLUE download's layout) or,
    # with use_tfds, TFDS glue/ax
    config.predict_diagnostic = task == "mnli"
    config.diagnostic_file = ""
    config.max_seq_length = 128
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
    config.train_batch_size = 32  # paper: 32
    config.eval_batch_size = 64
    config.learning_rate = LEARNING_RATES[0]  # paper: best on dev of LEARNING_RATES
    config.num_train_epochs = 3.0  # paper: 3
    config.warmup_proportion = 0.1
    config.weight_decay = 0.01
    config.seed = 0
    config.log_every = 50
    config.save_checkpoint = True
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=0))
    return config
