"""WordPiece ids against the reference on every line: bert_jax's Tokenizer and transformers' slow BertTokenizer
(made to follow google-research/bert, tests/test_tokenization.py) on every distinct non-empty line of
Gutenberg, WikiText-2 (valid, test) and the SQuAD v1.1 / v2.0 files, uncased with Google's vocabulary.

  .venv/bin/python benchmarks/tokenizer_parity.py [--stride 1]

The suite compares every 8th of these lines (`tests/test_tokenization.py`, SAMPLE_STRIDE); this compares
all of them. Prints the lines compared, both timings and the
mismatches (the first few in full); exit status 1 when any line differs.
"""

import argparse
import json
import sys

from shared_data import DATA, ROOT

sys.path.insert(0, str(ROOT / "tests"))

from conftest import SQUAD_V2_DEV  # noqa: E402
from test_tokenization import SQUAD_FILES, UNCASED_VOCAB, _corpus_lines, compare_with_reference  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stride", type=int, default=1, help="compare every N-th distinct line")
    args = parser.parse_args()
    v2 = next(f"squad/{name}" for name in SQUAD_V2_DEV if (DATA / "squad" / name).is_file())
    squad = {name: json.loads((DATA / name).read_text(encoding="utf-8"))["data"] for name in (*SQUAD_FILES, v2)}
    mismatches, _, summary = compare_with_reference(_corpus_lines(DATA, squad), DATA / UNCASED_VOCAB, args.stride)
    print(summary)
    print(f"{len(mismatches)} lines differ")
    for text in mismatches[:5]:
        print(f"  {text[:200]!r}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
