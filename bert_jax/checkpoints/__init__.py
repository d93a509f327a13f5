"""Weights and checkpoints: `checkpointing` (Orbax checkpoints of a run), `weights` (the parameter tree by
name), `hf` (Hugging Face directories both ways), `tf1` (Google's original TensorFlow checkpoints), `sources`
(what `init_checkpoint` names, resolved and loaded), `convert` (the `python -m bert_jax.convert` command)."""
