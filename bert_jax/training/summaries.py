"""Run summaries: TensorBoard scalar event files (tensorboardX), the same scalars as JSON lines
(`metrics.jsonl`, for scripts and plots), training-curve PNGs (matplotlib) and the console progress
bar (tqdm).

Only process 0 writes: callers pass `enabled=jax.process_index() == 0`.
"""

from __future__ import annotations

import io
import json
import sys
from typing import Sequence

from bert_jax import storage


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported without torch unless torch is loaded already: tensorboardX
    imports torch when it is installed only to accept torch tensors, and a Writer passes floats."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects without torch
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide:
            del sys.modules["torch"]
    return SummaryWriter


class Writer:
    """Scalars to `<workdir>/tensorboard/` (event files) and `<workdir>/metrics.jsonl` (one JSON object
    per call: {"step", "prefix", name: value, ...}; continued, not replaced, by a resumed run).

    `workdir` may be a local path or a gs:// URI. Object stores cannot append, so for a URI the JSON lines
    are kept in memory (a few MB for a million steps logged every 100) and the whole object is rewritten
    at each call; locally the file is appended to and flushed.
    """

    def __init__(self, workdir: str):
        SummaryWriter = _summary_writer_class()
        storage.makedirs(workdir)
        self.tensorboard = SummaryWriter(storage.join(workdir, "tensorboard"))
        self.jsonl_path = storage.join(workdir, "metrics.jsonl")
        if storage.is_remote(workdir):
            self.jsonl = None
            self.lines = storage.read_text(self.jsonl_path) if storage.exists(self.jsonl_path) else ""
        else:
            self.jsonl = open(self.jsonl_path, "a", encoding="utf-8")

    def scalars(self, step: int, values: dict[str, float], prefix: str) -> None:
        for k, v in values.items():
            self.tensorboard.add_scalar(f"{prefix}/{k}", v, step)
        self.tensorboard.flush()
        line = json.dumps({"step": int(step), "prefix": prefix, **{k: float(v) for k, v in values.items()}}) + "\n"
        if self.jsonl is None:
            self.lines += line
            storage.write_text(self.jsonl_path, self.lines)
        else:
            self.jsonl.write(line)
            self.jsonl.flush()

    def close(self) -> None:
        self.tensorboard.close()
        if self.jsonl is not None:
            self.jsonl.close()


def open_writer(workdir: str, enabled: bool = True) -> Writer | None:
    """A `Writer` on `workdir`, or None when not enabled (processes other than 0)."""
    return Writer(workdir) if enabled else None


def write_scalars(writer: Writer | None, step: int, values: dict[str, float], prefix: str) -> None:
    """Writes `values` as `<prefix>/<name>` scalars at `step` (no-op for writer None)."""
    if writer is not None:
        writer.scalars(step, values, prefix)


def read_metrics(workdir: str, prefix: str = "train") -> list[dict[str, float]]:
    """The `prefix` records of `<workdir>/metrics.jsonl` by step; after a resume the last record of a
    step wins.

    Raises:
      FileNotFoundError: no metrics.jsonl in workdir.
    """
    by_step: dict[int, dict] = {}
    for line in storage.read_text(storage.join(workdir, "metrics.jsonl")).splitlines():
        record = json.loads(line)
        if record.pop("prefix") == prefix:
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def plot_curves(records: Sequence[dict[str, float]], names: Sequence[str], path: str, title: str = "",
                vertical_lines: Sequence[int] = ()) -> str:
    """One panel per metric name (x = step) as a PNG at `path` (local or URI), written all at once.

    Args:
      records: dicts with "step" and the named metrics (from `read_metrics`).
      vertical_lines: steps to mark (e.g. the phase switch).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in names if any(n in r for r in records)]
    fig, axes = plt.subplots(1, max(len(names), 1), figsize=(4 * max(len(names), 1), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        points = [(r["step"], r[name]) for r in records if name in r]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=".", linewidth=1)
        for x in vertical_lines:
            ax.axvline(x, color="gray", linestyle="--", linewidth=0.8)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    storage.write_bytes(path, png.getvalue())
    return path


def progress_bar(start: int, total: int, enabled: bool, desc: str):
    """A tqdm bar on stderr from `start` to `total` steps with ETA (disabled: a silent bar)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, dynamic_ncols=True, file=sys.stderr)
