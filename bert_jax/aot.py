"""`python -m bert_jax.aot`: ahead-of-time compilation for TPU topologies (`bert_jax.training.aot`)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_jax.training.aot", run_name="__main__", alter_sys=True)
