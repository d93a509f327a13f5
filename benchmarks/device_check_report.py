"""The device check's output (benchmarks/device_check.py): the run's clock and printed lines, the rows so far as one
markdown table and a JSON file, and the watchdog that prints the table and ends the run at the hard deadline.

Standard library only: imported before jax, so `elapsed()` counts from the start of the check.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import threading
import time

START = time.monotonic()

# The sides' names: bert_jax's default recipe, the eager peer, the compiled peer (variants: "bert_jax[...]").
OURS, PEER, PEER_COMPILED = "bert_jax", "transformers", "transformers+compile"


def elapsed() -> float:
    """Seconds since the check started (this module's import)."""
    return time.monotonic() - START


def say(line: str) -> None:
    """Print `line` at once (the run's log is read while it runs)."""
    print(line, flush=True)


class Report:
    """The rows so far (measured, failed or skipped), printed as one markdown table at the end, or by the
    watchdog when the hard deadline passes; the JSON file (args.out) rewritten after every row.

    Reads args.out and args.sizes_list (the table's size order)."""

    def __init__(self, args, env: dict, peak: float | None):
        self.args, self.env, self.peak = args, env, peak
        self.rows: list[dict] = []
        self.kernel_checks: list[dict] = []
        self.lock = threading.Lock()
        self.printed = False

    def add(self, row: dict) -> None:
        with self.lock:
            self.rows.append(row)
            self.write()

    def write(self) -> None:
        if self.args.out:
            pathlib.Path(self.args.out).write_text(json.dumps(
                {"env": self.env, "device": self.env["device_kind"], "rows": self.rows,
                 "kernel_checks": self.kernel_checks}, indent=2, default=str))

    def table(self) -> str:
        """The markdown table: one line per row, ordered by size, phase and side."""
        order = {s: i for i, s in enumerate(self.args.sizes_list)}
        sides = {}
        for row in self.rows:
            sides.setdefault(row["side"], len(sides))
        peer_first = {OURS: 0, PEER: 2, PEER_COMPILED: 3}
        rows = sorted(self.rows, key=lambda r: (order.get(r["size"], 99), r["phase"],
                                                peer_first.get(r["side"], 1), sides[r["side"]]))
        lines = ["| size | phase | side | rows | seq/s | useful tok/s | padding | MFU | ms/step | compile s | "
                 "ratio vs peer | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            base = next((p for p in self.rows if p["size"] == r["size"] and p["phase"] == r["phase"]
                         and p["side"] == PEER and p.get("useful_tokens_per_second")), None)
            if r.get("useful_tokens_per_second"):
                ratio = f"{r['useful_tokens_per_second'] / base['useful_tokens_per_second']:.2f}x" if base else "-"
                mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
                compile_s = f"{r['compile_s']:.1f}" if r.get("compile_s") is not None else "-"
                cells = [f"{r['rows']}", f"{r['sequences_per_second']:,.1f}", f"{r['useful_tokens_per_second']:,.0f}",
                         f"{100 * r['padding']:.1f}%", mfu, f"{r['ms_per_step']:.1f}", compile_s, ratio]
            else:
                cells = [f"{r.get('rows', '-')}"] + ["-"] * 7
            lines.append("| " + " | ".join([r["size"], str(r["phase"]), r["side"]] + cells + [r.get("note", "")])
                         + " |")
        return "\n".join(lines)

    def finish(self, reason: str = "") -> None:
        """Print `reason` and the table, and write the JSON file, once (later calls do nothing)."""
        with self.lock:
            if self.printed:
                return
            self.printed = True
            if reason:
                say(reason)
            say("\n" + self.table())
            self.write()


class Watchdog:
    """A daemon thread: past `hard_deadline_s` (from the start) it says which row and stage were running,
    prints the report's table and ends the process (exit status 3). No thread for a deadline of 0."""

    def __init__(self, report: Report, hard_deadline_s: float):
        self.report, self.hard = report, hard_deadline_s
        self.stage, self.since = "starting", time.monotonic()
        self.active = True
        if hard_deadline_s > 0:
            threading.Thread(target=self._watch, daemon=True).start()

    def set(self, stage: str) -> None:
        self.stage, self.since = stage, time.monotonic()

    def stop(self) -> None:
        """The check is ending by itself: the watchdog does nothing more."""
        self.active = False

    def _watch(self) -> None:
        while self.active and elapsed() < self.hard:
            time.sleep(0.5)
        if not self.active:
            return
        self.report.finish(f"hard deadline {self.hard:.0f} s: stopped while {self.stage} "
                           f"({time.monotonic() - self.since:.0f} s in that stage); the table of the rows done:")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
