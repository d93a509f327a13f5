"""Training: `steps` (the one step machinery: state, sharded train / eval steps), `loop` (the one training
loop), `optim` (optimizers and schedules), `losses`, `sharding` (mesh and logical axis rules), `distributed`
(multi-host start-up), `summaries` (TensorBoard, metrics.jsonl, progress bars), `pretraining` (the pre-training
job behind `python -m bert_jax.train`), `evaluation` (its held-out evaluation), `aot` (ahead-of-time TPU
compilation behind `python -m bert_jax.aot`), `host_malloc` (XLA:CPU malloc tunables)."""
