"""The device check's kernel checks (`benchmarks/device_check.py --gpu_tests`): the gpu set's fused attention
kernels against `flash_gpu.reference_attention` (plain jnp), value and gradients (d query, d key, d value), at
BERT's shapes in bfloat16 (H = 64, L = 128 and 512): flash_gpu with and without its in-kernel dropout (not
interpreted), cuDNN's attention without dropout; then layer_norm_gpu against `layer_norm_gpu.reference` at
BERT-Large's and BERT-Base's hidden sizes; max errors relative to the largest entry (tests/
test_flash_attention.py's measure, bound 2e-2), then on a GPU the fwd+bwd time of each attention form against the
plain form at BERT-Large's shapes. On a CPU: Pallas's interpreter and XLA's lowering of the cuDNN call, small shapes.
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
import traceback

import jax
import numpy as np

from device_check_report import Report, say


def _segments(batch: int, length: int) -> np.ndarray:
    """int32 [batch, length]: row 0 padded (80% real tokens: segment 1, then padding: 0), row 1 packed (segments
    1, 2, 3 and padding), the rest one full segment."""
    seg = np.ones((batch, length), np.int32)
    seg[0, int(0.8 * length):] = 0
    if batch > 1:
        e = length // 8
        seg[1] = [1] * e + [2] * 3 * e + [3] * 3 * e + [0] * (length - 7 * e)
    return seg


def kernel_checks(report: Report) -> bool:
    """The gpu set's fused attention kernels (flash_gpu on q, k, v and, as training calls it, on the packed projections
    with their biases; cuDNN's) against `flash_gpu.reference_attention`, value and gradients, bfloat16, and on a GPU their fwd+bwd times at BERT-Large's shapes (`report.kernel_checks`). Prints a line per
    case; True when every error is within 2e-2 of the largest entry."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import base, flash_gpu, gpu

    on_gpu = jax.default_backend() == "gpu"
    if not on_gpu:
        gpu.IMPLEMENTATION = "xla"  # cuDNN's call lowered by XLA (the CPU tests' setting)
    shapes = [(4, 16, 128, 64), (2, 16, 512, 64)] if on_gpu else [(2, 2, 64, 64)]
    say(f"kernel checks on {jax.devices()[0].device_kind} ({'GPU kernels' if on_gpu else 'CPU: Pallas interpreter'}"
        f", cuDNN attention as {gpu.IMPLEMENTATION}), bfloat16, errors relative to the largest entry (bound 2e-2):")
    all_ok = True
    rng = jax.random.key(7)
    cases = [("flash_gpu", 0.1), ("flash_gpu packed", 0.1), ("flash_gpu", 0.0), ("cudnn", 0.0)]
    for b, n, length, h in shapes:
        keys = jax.random.split(jax.random.key(length), 4)
        q = (jax.random.normal(keys[0], (b, n, length, h)) / np.sqrt(h)).astype(jnp.bfloat16)
        k, v = (jax.random.normal(x, (b, n, length, h)).astype(jnp.bfloat16) for x in keys[1:3])
        weight = jax.random.normal(keys[3], (b, n, length, h)).astype(jnp.bfloat16)
        seg = jnp.asarray(_segments(b, length))
        biases = [0.5 * jax.random.normal(jax.random.fold_in(keys[3], i), (n, h)) for i in range(3)]
        for name, rate in cases:
            plain = functools.partial(flash_gpu.reference_attention, segment_ids=seg, dropout_rate=rate, rng=rng)
            names, extra = ("context", "dq", "dk", "dv"), ()
            if name == "flash_gpu":
                kernel = functools.partial(flash_gpu.attention, segment_ids=seg, dropout_rate=rate,
                                           seed=flash_gpu.seeds(rng), interpret=not on_gpu)
            elif name == "flash_gpu packed":  # as training calls it: the projections packed, biases and scale in it
                scale = 1.0 / np.sqrt(h)

                def kernel(q, k, v, bq, bk, bv, rate=rate, scale=scale):
                    slots = dict(query=q, key=k, value=v)
                    packed = jnp.stack([jnp.swapaxes(slots[s], 1, 2) for s in base.PACKED_SLOTS], axis=2)
                    return jnp.swapaxes(flash_gpu.attention(packed, None, None, seg, dropout_rate=rate, layout="BL3NH",
                                                            seed=flash_gpu.seeds(rng), bias=(bq, bk, bv), scale=scale,
                                                            interpret=not on_gpu), 1, 2)

                def plain(q, k, v, bq, bk, bv, rate=rate, scale=scale):
                    q, k, v = ((x + b[None, :, None, :].astype(x.dtype)).astype(x.dtype)  # the model's bias add
                               for x, b in zip((q, k, v), (bq, bk, bv)))
                    return flash_gpu.reference_attention((q * scale).astype(q.dtype), k, v, seg, dropout_rate=rate,
                                                         rng=rng)

                # d bias_k is 0 up to rounding (q . bias_k shifts a whole softmax row): not compared.
                names, extra = names + ("d bias_q", "d bias_v"), tuple(biases)
            else:
                kernel = functools.partial(gpu.attention, segment_ids=seg)

            @jax.jit
            def both(q, k, v, weight, *bias, kernel=kernel, plain=plain):
                out = []
                for f in (kernel, plain):
                    value, vjp = jax.vjp(f, q, k, v, *bias)
                    grads = vjp(weight)
                    out.append((value, *grads[:3], *((grads[3], grads[5]) if bias else ())))
                return out

            all_ok &= _check_case(report, f"{name} [{b}, {n}, {length}, {h}] dropout {rate}",
                                  lambda: both(q, k, v, weight, *extra), names)
    all_ok &= _layer_norm_checks(report, on_gpu, rng)
    if on_gpu:
        _kernel_times(report, rng)
    return all_ok


def _layer_norm_checks(report: Report, on_gpu: bool, rng) -> bool:
    """layer_norm_gpu's LayerNorm(residual + dropout(x + x_bias)) against `layer_norm_gpu.reference`, value and
    gradients (dx, dresidual, dscale, dbias, dx_bias), bfloat16, dropout 0.1, at BERT-Large's and BERT-Base's hidden
    sizes (1,024; 768 in masked lanes) on a GPU, a small shape interpreted on a CPU. True when within the bound."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import dropout, layer_norm_gpu

    ok_all = True
    shapes = [(8, 128, 1024), (2, 512, 768)] if on_gpu else [(2, 16, 48)]
    seed = dropout.seeds(rng)
    for shape in shapes:
        keys = jax.random.split(jax.random.key(shape[-1]), 6)
        x, weight = (jax.random.normal(k, shape).astype(jnp.bfloat16) for k in keys[:2])
        residual = (2.0 + jax.random.normal(keys[2], shape)).astype(jnp.bfloat16)
        scale, bias, x_bias = (0.1 * jax.random.normal(k, shape[-1:]) + (1.0 if i == 0 else 0.0)
                               for i, k in enumerate(keys[3:]))

        def fused(x, residual, scale, bias, x_bias):
            return layer_norm_gpu.dropout_add_layer_norm(x, residual, scale, bias, epsilon=1e-12, x_bias=x_bias,
                                                         dropout_rate=0.1, seed=seed, interpret=not on_gpu)

        def plain(x, residual, scale, bias, x_bias):
            return layer_norm_gpu.reference(x, residual, scale, bias, epsilon=1e-12, x_bias=x_bias, dropout_rate=0.1,
                                            seed=seed)

        @jax.jit
        def both(*args):
            out = []
            for f in (fused, plain):
                value, vjp = jax.vjp(f, *args)
                out.append((value, *vjp(weight)))
            return out

        ok_all &= _check_case(report, f"layer_norm_gpu {list(shape)} dropout 0.1",
                              lambda: both(x, residual, scale, bias, x_bias),
                              ("y", "dx", "dresidual", "dscale", "dbias", "dx_bias"))
    return ok_all


def _check_case(report: Report, label: str, run, names: tuple[str, ...]) -> bool:
    """One kernel check: `run()` -> (the kernel's outputs, the plain form's), compared output by output (`names`)
    as the max error relative to the plain form's largest entry, bound 2e-2; a line and a `report.kernel_checks`
    record either way (a kernel that does not compile is a result: its first error line). True when within the bound."""
    start = time.perf_counter()
    try:
        got, want = jax.device_get(run())
    except Exception as e:  # noqa: BLE001 - a kernel that does not compile is a result to report
        first = (str(e).strip().splitlines() or [""])[0][:300]
        say(f"  {label}: FAILED: {type(e).__name__}: {first}")
        traceback.print_exc(file=sys.stderr)
        report.kernel_checks.append({"case": label, "error": f"{type(e).__name__}: {first}"})
        return False
    errors = {}
    for out_name, g, w in zip(names, got, want):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        errors[out_name] = float(np.abs(g - w).max() / np.abs(w).max()) if np.isfinite(g).all() else np.inf
    ok = all(e <= 2e-2 for e in errors.values())
    report.kernel_checks.append({"case": label, "errors": errors, "ok": ok})
    say(f"  {label}: " + ", ".join(f"{k} {e:.1e}" for k, e in errors.items())
        + f" {'ok' if ok else 'OVER THE BOUND'} ({time.perf_counter() - start:.1f} s with compilation)")
    return ok


def _kernel_times(report: Report, rng) -> None:
    """ms per fwd+bwd of each attention form at BERT-Large's phase 1 and packed phase 2 shapes (on a GPU)."""
    import jax.numpy as jnp

    from bert_jax.model.kernels import flash_gpu, gpu

    say("attention fwd+bwd, ms (median of 10), BERT-Large shapes, bfloat16:")
    for b, n, length, h in ((128, 16, 128, 64), (16, 16, 512, 64)):
        keys = jax.random.split(jax.random.key(1), 4)
        q, k, v, weight = (jax.random.normal(x, (b, n, length, h)).astype(jnp.bfloat16) for x in keys)
        seg = jnp.asarray(_segments(b, length))
        forms = {"flash_gpu dropout 0.1": functools.partial(flash_gpu.attention, segment_ids=seg, dropout_rate=0.1,
                                                            seed=flash_gpu.seeds(rng)),
                 "jnp + hashed dropout 0.1": functools.partial(flash_gpu.reference_attention, segment_ids=seg,
                                                               dropout_rate=0.1, rng=rng),
                 "cudnn, no dropout": functools.partial(gpu.attention, segment_ids=seg),
                 "flash_gpu, no dropout": functools.partial(flash_gpu.attention, segment_ids=seg),
                 "jnp, no dropout": functools.partial(flash_gpu.reference_attention, segment_ids=seg)}
        cells = []
        for name, f in forms.items():
            grad = jax.jit(jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v).astype(jnp.float32) * weight),
                                    argnums=(0, 1, 2)))
            try:
                jax.block_until_ready(grad(q, k, v))
                times = []
                for _ in range(10):
                    start = time.perf_counter()
                    jax.block_until_ready(grad(q, k, v))
                    times.append(time.perf_counter() - start)
                ms = 1e3 * statistics.median(times)
                cells.append(f"{name} {ms:.2f}")
                report.kernel_checks.append({"time": f"{name} [{b}, {n}, {length}, {h}]", "ms": ms})
            except Exception as e:  # noqa: BLE001
                cells.append(f"{name} failed ({type(e).__name__})")
        say(f"  [{b}, {n}, {length}, {h}]: " + "; ".join(cells))
