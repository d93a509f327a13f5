"""Explicit user-facing downloads (never called at import or test time).

  python -m bert_jax.data.download squad --output_dir data/squad [--version 1.1|2.0|all]

SQuAD: the official JSON files of the SQuAD explorer site, each written through a temporary name
and renamed, so an interrupted download leaves no partial file. Corpora and GLUE come through TFDS
(`python -m bert_jax.data.create_pretraining_data --tfds_name=...`, `bert_jax/configs/glue.py --config.use_tfds`).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.request

from bert_jax import errors

SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/"
SQUAD_FILES = {"1.1": ("train-v1.1.json", "dev-v1.1.json"), "2.0": ("train-v2.0.json", "dev-v2.0.json")}


def download_squad(output_dir: str, version: str = "1.1") -> list[str]:
    """Downloads the official SQuAD train and dev files of `version` ("1.1", "2.0" or "all").

    Returns the paths written. Raises ValueError for an unknown version, OSError on network errors.
    """
    versions = list(SQUAD_FILES) if version == "all" else [version]
    if any(v not in SQUAD_FILES for v in versions):
        raise ValueError(f"--version {version!r} is not one of {sorted(SQUAD_FILES)} or 'all'")
    os.makedirs(output_dir, exist_ok=True)
    written = []
    for v in versions:
        for name in SQUAD_FILES[v]:
            path = os.path.join(output_dir, name)
            tmp = f"{path}.tmp{os.getpid()}"
            with urllib.request.urlopen(SQUAD_URL + name, timeout=60) as response, open(tmp, "wb") as f:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
            os.replace(tmp, path)
            written.append(path)
            print(f"wrote {path}", flush=True)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_jax.data.download", description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=["squad"])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--version", default="1.1")
    args = parser.parse_args(argv)
    try:
        download_squad(args.output_dir, args.version)
    except errors.USER_ERRORS as e:
        print(errors.exit_with("download", e).code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import console

    console.install()
    sys.exit(main(sys.argv[1:]))
