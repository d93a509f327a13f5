"""What a compiled train step needs and does on the machine it is compiled for, read without running it.

  targets        the machines `bert_jax.aot` compiles for without having one (TPU slices, NVIDIA GPU machines):
                 compile-only devices and their roofline figures
  memory         whether a compiled step fits a device's memory, and what to change where it does not
                 (`bert_jax.aot` and `bert_jax.train`'s check before step 0)
  program_stats  the optimised program's kernels and the bytes they move (the roofline's memory term)
"""
