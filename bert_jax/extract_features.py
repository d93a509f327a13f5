"""`python -m bert_jax.extract_features`: feature extraction (paper section 5.3) (`bert_jax.tasks.extract_features`)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bert_jax.tasks.extract_features", run_name="__main__", alter_sys=True)
