"""`python -m bert_jax.demo`: the demo (make demo) (`bert_jax.experiments.demo`)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_jax.experiments.demo", run_name="__main__", alter_sys=True)
