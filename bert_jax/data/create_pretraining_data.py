"""Command line: pre-training instances as sharded ArrayRecord files, with the original's flags.

  python -m bert_jax.data.create_pretraining_data --input_file=corpus/*.txt --output_dir=out \\
      --vocab_file=vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=5

--tokenize_only writes tokenized documents instead (`bert_jax.data.pretraining.document_shards`: the corpus tokenized
once into --num_shards ArrayRecord shards by --num_workers processes; `bert_jax.data.pretraining.dynamic` draws
instances and masks from them while training, a fresh draw each epoch), and a phase's data_dir may point at
the output. The flags of instances (`STATIC_ONLY`: --max_seq_length, --max_predictions_per_seq,
--masked_lm_prob, --do_whole_word_mask, --short_seq_prob, --short_seq_per_document, --dupe_factor,
--random_seed) are then an error when given: the length and masking are each phase's config fields of
`bert_jax.train` (`bert_jax.configs.pretrain.phase`), the seed its config.seed, and every epoch draws afresh.

--runner (and Apache Beam's pipeline options after it, each as --name=value) runs the same preparation on
Apache Beam (`bert_jax.data.pretraining.beam_pipeline`: the same bytes; --num_workers, when given, is then Beam's own
option of that name, e.g. Dataflow's initial number of workers: `beam_pipeline.runner_args`):
  --runner=DirectRunner --direct_num_workers=2 --direct_running_mode=multi_processing   (this machine)
  --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp            (Google Cloud)
--dedupe=lines|documents drops lines or documents seen before in the corpus (`bert_jax.data.dedupe`).

Input formats: `sentences` (the original: one sentence per line, blank line between documents),
`text` (each file one document of paragraphs, split into sentences), or a TFDS dataset with
--tfds_name. See `bert_jax.data.pretraining.procedure` for the procedure and the output format.
"""


from absl import app, flags

from bert_jax import errors, storage
from bert_jax.data import corpus, dedupe, tokenization
from bert_jax.data.pretraining import document_shards, procedure

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "Comma-separated globs of input text files.")
flags.DEFINE_string("output_dir", None, "Directory for the ArrayRecord shards and metadata.json.")
flags.DEFINE_string("vocab_file", None, "WordPiece vocabulary (Google vocab.txt format).")
flags.DEFINE_bool("do_lower_case", True, "Lower-case and strip accents (uncased models).")
flags.DEFINE_bool("do_whole_word_mask", False, "Mask whole words (all WordPieces of a word) at once.")
flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length, [CLS] and [SEP]s included.")
flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked-LM predictions per sequence.")
flags.DEFINE_integer("random_seed", 12345, "Seed for everything random.")
flags.DEFINE_integer("dupe_factor", 10, "Passes over the input, each with different masks.")
flags.DEFINE_float("masked_lm_prob", 0.15, "Fraction of tokens to mask.")
flags.DEFINE_float("short_seq_prob", 0.1, "Probability of a shorter target length.")
flags.DEFINE_bool("short_seq_per_document", False,
                  "Draw the short target length once per document, as the original script actually does "
                  "(default: once per instance, as the paper and the original flag's help describe).")
flags.DEFINE_enum("input_format", "sentences", ["sentences", "text"],
                  "sentences: one sentence per line, blank line between documents; text: one document per "
                  "file, paragraphs split into sentences.")
flags.DEFINE_integer("num_workers", 1, "Processes generating instances (output does not depend on it); with --runner, "
                     "Apache Beam's --num_workers (Dataflow: the initial number of workers), passed on when given.")
flags.DEFINE_integer("num_shards", 1, "Output ArrayRecord shards.")
flags.DEFINE_string("tfds_name", None, "TFDS text dataset instead of --input_file, e.g. wikipedia/20230601.en.")
flags.DEFINE_string("tfds_split", "train", "TFDS split.")
flags.DEFINE_string("tfds_text_key", "text", "TFDS feature holding the document text.")
flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir (default: TFDS's own).")
flags.DEFINE_bool("tokenize_only", False, "Write tokenized documents for dynamic instances (bert_jax.data.pretraining.dynamic), "
                  "not instances.")
flags.DEFINE_enum("dedupe", "none", list(dedupe.MODES), "Drop lines or documents seen before in the corpus "
                  "(exact, whole corpus; counted in metadata.json's skipped).")
flags.DEFINE_string("runner", None, "Apache Beam runner (DirectRunner, DataflowRunner, FlinkRunner, SparkRunner): "
                    "prepare on Beam (bert_jax.data.pretraining.beam_pipeline), with Beam's options as further --name=value "
                    "flags. Default: processes on this machine.")


# The flags only static instances use -> what takes their place when `bert_jax.train` draws instances from
# tokenized documents.
_PHASE_FIELD = ("it is a phase config field of bert_jax.train when drawing instances while training "
                "(--config.phases[i].{})")
STATIC_ONLY = {
    **{name: _PHASE_FIELD.format(name) for name in ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob",
                                                    "do_whole_word_mask", "short_seq_prob")},
    "short_seq_per_document": "bert_jax.train draws the short target length per instance when drawing instances "
                              "while training",
    "dupe_factor": "bert_jax.train draws new instances and masks every epoch when drawing instances while training",
    "random_seed": "bert_jax.train seeds its draws with config.seed when drawing instances while training",
}


def check_tokenize_only_flags(flag_values=None) -> None:
    """With --tokenize_only, no flag of `STATIC_ONLY` given on the command line (absl's `present`, even at its
    default value): they would be dropped.

    Raises:
      ValueError: one line naming each such flag and what takes its place.
    """
    flag_values = flag_values or FLAGS
    given = [name for name in STATIC_ONLY if flag_values[name].present]
    if flag_values.tokenize_only and given:
        raise ValueError("; ".join(f"--{name} applies to static instances only, not --tokenize_only: "
                                   f"{STATIC_ONLY[name]}" for name in given))


def main(argv):
    positional = [a for a in argv[1:] if not a.startswith("-")]
    if positional:
        raise app.UsageError(f"unexpected arguments {positional}")
    beam_args = argv[1:]
    if beam_args and not FLAGS.runner:
        raise errors.exit_with("create_pretraining_data", ValueError(
            f"unknown flags {beam_args} (Apache Beam's pipeline options go with --runner)"))
    if not FLAGS.output_dir or not FLAGS.vocab_file:
        raise SystemExit("--output_dir and --vocab_file are required")
    if bool(FLAGS.input_file) == bool(FLAGS.tfds_name):
        raise SystemExit("give exactly one of --input_file and --tfds_name")
    try:
        check_tokenize_only_flags()
        storage.check_output_dir(FLAGS.output_dir, "--output_dir")
        tokenizer = tokenization.Tokenizer(FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case)
        source = {"input_file": FLAGS.input_file, "tfds_name": FLAGS.tfds_name, "input_format": FLAGS.input_format}
        if FLAGS.dedupe != "none":
            source["dedupe"] = FLAGS.dedupe
        extra = source if FLAGS.tokenize_only else {**source, "do_lower_case": FLAGS.do_lower_case}
        options = procedure.InstanceOptions(
            max_seq_length=FLAGS.max_seq_length, max_predictions_per_seq=FLAGS.max_predictions_per_seq,
            masked_lm_prob=FLAGS.masked_lm_prob, short_seq_prob=FLAGS.short_seq_prob,
            do_whole_word_mask=FLAGS.do_whole_word_mask, short_seq_per_document=FLAGS.short_seq_per_document)
        if FLAGS.runner:
            from bert_jax.data.pretraining import beam_pipeline

            if FLAGS.tfds_name:
                parts = beam_pipeline.tfds_parts(FLAGS.tfds_name, FLAGS.tfds_split, FLAGS.tfds_text_key,
                                                 FLAGS.tfds_data_dir)
            else:
                parts = beam_pipeline.file_parts(corpus.expand_input_files(FLAGS.input_file), FLAGS.input_format)
            metadata = beam_pipeline.run(
                parts, tokenizer, FLAGS.output_dir,
                beam_args=beam_pipeline.runner_args(
                    FLAGS.runner, FLAGS.num_workers if FLAGS["num_workers"].present else None, beam_args), tokenize_only=FLAGS.tokenize_only,
                num_shards=FLAGS.num_shards, options=options, dupe_factor=FLAGS.dupe_factor,
                random_seed=FLAGS.random_seed, dedupe_mode=FLAGS.dedupe, extra_metadata=extra)
        else:
            stats = corpus.ReadStats()
            if FLAGS.tfds_name:
                documents = corpus.read_tfds_documents(FLAGS.tfds_name, FLAGS.tfds_split, FLAGS.tfds_text_key,
                                                       FLAGS.tfds_data_dir, stats)
            else:
                read = {"sentences": corpus.read_sentence_documents,
                        "text": corpus.read_text_documents}[FLAGS.input_format]
                documents = read(corpus.expand_input_files(FLAGS.input_file), stats)
            documents = dedupe.drop_repeats(documents, FLAGS.dedupe, dedupe.first_seen(), stats)
            if FLAGS.tokenize_only:
                metadata = document_shards.tokenize_documents(
                    documents, tokenizer, FLAGS.output_dir, num_shards=FLAGS.num_shards,
                    num_workers=FLAGS.num_workers, read_stats=stats, extra_metadata=extra)
            else:
                metadata = procedure.create_pretraining_data(
                    documents, tokenizer, FLAGS.output_dir, options=options, dupe_factor=FLAGS.dupe_factor,
                    random_seed=FLAGS.random_seed, num_shards=FLAGS.num_shards, num_workers=FLAGS.num_workers,
                    read_stats=stats, progress=True, extra_metadata=extra)
    except errors.USER_ERRORS as e:  # OSError: a missing input, an upload that failed
        given = f"--input_file={FLAGS.input_file}" if FLAGS.input_file else f"--tfds_name={FLAGS.tfds_name}"
        raise errors.exit_with("create_pretraining_data", corpus.name_the_input(e, given)) from None
    if FLAGS.tokenize_only:
        print(f"wrote {metadata['num_documents']} documents, {metadata['num_tokens']} tokens to "
              f"{FLAGS.output_dir} in {metadata['seconds']:.1f} s (skipped: {metadata['skipped']})")
    else:
        print(f"wrote {metadata['num_instances']} instances in {len(metadata['shards'])} shard(s) to "
              f"{FLAGS.output_dir} in {metadata['seconds']:.1f} s (skipped: {metadata['skipped']})")
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    errors.run(main, "create_pretraining_data", known_only=True)
