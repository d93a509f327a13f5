"""`python -m bert_jax.convert`: conversion to and from Hugging Face and TF1 checkpoints (`bert_jax.checkpoints.convert`)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_jax.checkpoints.convert", run_name="__main__", alter_sys=True)
