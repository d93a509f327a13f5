"""The model (paper section 3) and what it is built from: `bert_config` (BertConfig, the bert_config.json
fields), `modeling` (BertModel, BertForPreTraining), `heads` (the fine-tuning heads), `layers` (building
blocks), `kernels` (backend-specific operations behind `model.kernels`), `flops` (analytic FLOPs and device
peaks). Imports nothing from the rest of bert_jax."""
