"""Pre-training data on disk and its input pipeline, imported in one direction (tests/test_imports.py):
`formats` (metadata, versions, shard opening) <- `document_shards` (tokenized documents), `token_store`,
`procedure` (the original's instance procedure and static instance records) <- `holdout`, `stream` (global
order), `packing`, `dynamic` (instances drawn while training) <- `loader` (grain pipelines); `beam_pipeline`
(the same preparation on Apache Beam)."""
