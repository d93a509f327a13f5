"""glibc malloc tunables for XLA:CPU runs: keep each step's temporary buffer mapped between steps.

  TUNABLES                     the settings, in GLIBC_TUNABLES syntax
  tuned_environ(environ)       environ with them added (a user's own values win), or None if all there
  reexec_tuned(reason)         re-run this process under them (for scripts that want them)
  python -m bert_jax.training.host_malloc
                               print the GLIBC_TUNABLES value to export (launch/local_cpu.sh uses it)

Why: XLA:CPU allocates one temporary buffer per execution of a compiled function and frees it at the
end (about a gigabyte for a BERT-Base pre-training step at batch 8, length 128). glibc serves any
block over 32 MB with its own `mmap` and gives it back with `munmap`, so every step faults the whole
buffer in again, 4 KiB at a time, and the kernel zeroes each page. With every thread on the one main heap (`arena_max=1`), no block mmapped on its own
(`mmap_max=0`) and the heap's top never given back (`trim_threshold`), the buffer is reused from step
to step with no fault at all; `hugetlb=1` asks for transparent huge pages on the heap (madvise).
The price: the process keeps its peak heap until it exits.

The gain on CPU steps, ours and transformers': benchmarks/README.md (`benchmarks/train_step.py
--malloc tuned`; that benchmark runs glibc's defaults unless asked, and prints which).

glibc reads GLIBC_TUNABLES only at process start: a shell exports it before starting Python, or a
script calls `reexec_tuned` first thing. Linux with glibc only; BERT_JAX_MALLOC_TUNING=off disables
both paths.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Mapping

TUNABLES: tuple[str, ...] = (
    "glibc.malloc.hugetlb=1",  # madvise(MADV_HUGEPAGE) on the heap (glibc >= 2.35; ignored before)
    "glibc.malloc.arena_max=1",  # every thread allocates from the main heap
    "glibc.malloc.mmap_max=0",  # no block gets its own mmap, however large
    "glibc.malloc.trim_threshold=4294967295",  # the heap's top is never given back to the kernel
)
OPT_OUT = "BERT_JAX_MALLOC_TUNING"  # "off": leave glibc's defaults alone


def tuned_environ(environ: Mapping[str, str]) -> dict[str, str] | None:
    """-> a copy of `environ` with the missing TUNABLES appended to GLIBC_TUNABLES, or None when none is
    missing. A tunable the environment already names, whatever its value, is kept as it is."""
    current = environ.get("GLIBC_TUNABLES", "")
    named = {item.split("=", 1)[0] for item in current.split(":") if item}
    missing = [t for t in TUNABLES if t.split("=", 1)[0] not in named]
    if not missing:
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(([current] if current else []) + missing)}


def applies_here(environ: Mapping[str, str] = os.environ) -> bool:
    """True on Linux with glibc, the tunables' only home, unless BERT_JAX_MALLOC_TUNING=off."""
    return (sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
            and environ.get(OPT_OUT, "").lower() != "off")


def _environ_to_use() -> dict[str, str] | None:
    """tuned_environ(os.environ) where the tunables apply here, else None."""
    return tuned_environ(os.environ) if applies_here() else None


def reexec_tuned(reason: str) -> None:
    """Replaces this process with the same command line (`sys.orig_argv`, same PID) under TUNABLES;
    returns only when there is nothing to do (set already, not glibc, or opted out).

    Call it first thing in a script's main, never from library code (it would replace the caller's
    process, e.g. pytest). `reason` names the caller in the one line printed to stderr.

    Raises:
      OSError: the interpreter could not be executed (os.execve).
    """
    environ = _environ_to_use()
    if environ is None:
        return
    print(f"{reason}: re-running under GLIBC_TUNABLES={environ['GLIBC_TUNABLES']}", file=sys.stderr, flush=True)
    os.execve(sys.executable, list(sys.orig_argv), environ)


def main() -> None:
    """Prints the GLIBC_TUNABLES value to export: the current one plus the missing TUNABLES, or the
    current one unchanged where they do not apply (see `applies_here`)."""
    print((_environ_to_use() or os.environ).get("GLIBC_TUNABLES", ""))


if __name__ == "__main__":
    main()
