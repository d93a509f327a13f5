"""Experiments on top of the library: `demo` (the main job behind `make demo`, `python -m bert_jax.demo`) and
`transfer` (corpora, pre-training data and fine-tuning probes of the transfer experiments, shared with the demo
and benchmarks/transfer.py)."""
