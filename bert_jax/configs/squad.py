"""SQuAD fine-tuning config: `get_config(size)`; size names the architecture for random init
(tiny | mini | small | base | large, default base); with config.init_checkpoint the architecture
comes from the checkpoint and only the compute options of config.model apply.

  python -m bert_jax.tasks.squad --config squad \\
      --config.init_checkpoint=/path/to/minilm --config.train_file=train-v1.1.json \\
      --config.predict_file=dev-v1.1.json --workdir /tmp/squad

Defaults are google-research/bert run_squad.py's flags (max_seq_length 384, doc_stride 128,
max_query_length 64, train_batch_size 32, learning_rate 5e-5, 3 epochs, warmup_proportion 0.1,
n_best_size 20, max_answer_length 30, null_score_diff_threshold 0.0). One addition, on by default:
tune_null_threshold (v2.0) also reports the official v2.0 script's best_f1 / best_exact and their
thresholds, and writes predictions.json at the best-F1 threshold, which is tuned on the predict file
itself; the metrics at null_score_diff_threshold are reported beside them (set it False for the
original's behaviour).
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
    config.train_file = ""  # SQuAD JSON to fine-tune on ("" = no training)
    config.predict_file = ""  # SQuAD JSON to predict and evaluate ("" = no prediction)
    config.version_2_with_negative = False  # SQuAD v2.0: unanswerable questions
    config.max_seq_length = 384  # tokens per window
    config.doc_stride = 128  # context tokens between window starts
    config.max_query_length = 64  # question tokens kept
    config.train_batch_size = 32  # global batch, windows
    config.predict_batch_size = 8
    config.learning_rate = 5e-5
    config.num_train_epochs = 3.0
    config.warmup_proportion = 0.1  # linear warmup over this share of the steps, then linear decay to 0
    config.weight_decay = 0.01  # AdamW, not on LayerNorm and biases
    config.n_best_size = 20
    config.max_answer_length = 30  # tokens
    config.null_score_diff_threshold = 0.0  # v2.0: predict "" when null score - best span score exceeds it
    config.tune_null_threshold = True  # v2.0: also report and write predictions at the best-F1 threshold
    config.max_train_examples = 0  # train only on the first N questions of train_file (0 = all)
    config.max_predict_examples = 0  # evaluate only the first N questions of predict_file (0 = all)
    config.seed = 0
    config.log_every = 50  # steps between TensorBoard / console metrics
    config.save_checkpoint = True  # write the fine-tuned state to <workdir>/checkpoints
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, num_devices=0))
    return config
