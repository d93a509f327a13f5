"""Run summaries: TensorBoard scalar event files (tensorboardX) and the console progress bar (tqdm).

Only process 0 writes: callers pass `enabled=jax.process_index() == 0`.
"""

from __future__ import annotations

import os
import sys


def open_writer(workdir: str, enabled: bool = True):
    """A tensorboardX SummaryWriter on `<workdir>/tensorboard`, or None when not enabled."""
    if not enabled:
        return None
    from tensorboardX import SummaryWriter

    return SummaryWriter(os.path.join(workdir, "tensorboard"))


def write_scalars(writer, step: int, values: dict[str, float], prefix: str) -> None:
    """Writes `values` as `<prefix>/<name>` scalars at `step` and flushes (no-op for writer None)."""
    if writer is None:
        return
    for k, v in values.items():
        writer.add_scalar(f"{prefix}/{k}", v, step)
    writer.flush()


def progress_bar(start: int, total: int, enabled: bool, desc: str):
    """A tqdm bar on stderr from `start` to `total` steps with ETA (disabled: a silent bar)."""
    from tqdm import tqdm

    return tqdm(total=total, initial=start, disable=not enabled, desc=desc, dynamic_ncols=True, file=sys.stderr)
