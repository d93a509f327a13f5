"""`python -m bert_jax.train`: the pre-training command (`bert_jax.training.pretraining`)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_jax.training.pretraining", run_name="__main__", alter_sys=True)
