"""`python -m bert_jax.aot`: ahead-of-time compilation for TPU slices and GPU machines (`bert_jax.training.aot`)."""

import os
import runpy

# Compile-only: the host's own accelerator is not used, and jax's CUDA plugin loads on a host without a GPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

if __name__ == "__main__":
    runpy.run_module("bert_jax.training.aot", run_name="__main__", alter_sys=True)
