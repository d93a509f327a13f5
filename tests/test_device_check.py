"""benchmarks/device_check.py, the accelerator check, on the CPU: its plan of rows, its table, its deadlines, and a
smoke run of every default row (its figures mean something on a GPU only) with the kernel checks."""

import argparse
import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import device_check  # noqa: E402

SMOKE = ["--sizes", "tiny", "--steps", "1", "--warmup", "1", "--rounds", "1", "--p1_batch", "8", "--p2_batch", "2",
         "--no_peer"]


def _args(**kwargs) -> argparse.Namespace:
    defaults = dict(sizes="base,large", phases="1,2", p1_batch=0, p2_batch=0, no_peer=False, peer_compile=False,
                    variants="", extras_sizes="", deadline_s=0.0, out="")
    defaults.update(kwargs)
    args = argparse.Namespace(**defaults)
    args.sizes_list, args.phases_list = args.sizes.split(","), [int(p) for p in args.phases.split(",")]
    return args


def test_phase_2_peer_trains_the_instances_our_packed_rows_hold():
    """Phase 2: the peer's padded rows are exactly the instances in our packed rows (the same tokens, masked
    positions' ids and NSP labels), so the two sides' seq/s and useful tokens/s compare like for like."""
    import device_check_rows
    import numpy as np

    ours, peer = device_check_rows.batches(2, 4)
    held = device_check_rows.packed_indices(ours)
    assert len(held) == len(set(held)) == len(peer["input_ids"]) == int(ours["next_sentence_weights"].sum()) > 4
    assert int(ours["attention_mask"].astype(bool).sum()) == int(peer["attention_mask"].sum())  # real tokens
    assert sorted(ours["input_ids"][ours["input_ids"] > 0].tolist()) == sorted(peer["input_ids"][peer["input_ids"] > 0].tolist())
    assert sorted(ours["masked_lm_ids"][ours["masked_lm_weights"] > 0].tolist()) == sorted(
        peer["masked_lm_ids"][peer["masked_lm_weights"] > 0].tolist())
    assert np.array_equal(np.sort(ours["next_sentence_labels"][ours["next_sentence_weights"] > 0]),
                          np.sort(peer["next_sentence_labels"]))


def test_variants_parse_into_sides_and_batches():
    sides = device_check.parse_variants("default,kernels=reference,attention_probs_dropout_prob=0,"
                                        "remat_policy=dots+batch=2x,scan_layers=True+batch=48")
    assert [s.name for s in sides] == ["bert_jax[kernels=reference]", "bert_jax[attention_probs_dropout_prob=0]",
                                       "bert_jax[remat_policy=dots+batch=2x]", "bert_jax[scan_layers=True+batch=48]"]
    assert sides[1].settings == (("attention_probs_dropout_prob", 0),)
    assert sides[3].settings == (("scan_layers", True), ("batch", "48"))
    args = _args(p2_batch=8)
    assert [sides[2].rows("large", p, args) for p in (1, 2)] == [256, 16]  # 2x the size's rows, or --p2_batch's
    assert sides[3].rows("base", 1, args) == 48 and sides[0].rows("base", 1, args) == 256
    for bad in ("kernels", "no_such_field=1", "kernels=reference+dtype"):
        with pytest.raises(ValueError, match="is not field=value with a field of config.model or batch"):
            device_check.parse_variants(bad)


def test_plan_runs_the_defaults_first_then_the_extras():
    rows = device_check.plan(_args(peer_compile=True, variants="kernels=reference", extras_sizes="large"))
    names = [(size, phase, side.name) for size, phase, side in rows]
    assert names == [("base", 1, "bert_jax"), ("base", 1, "transformers"), ("base", 2, "bert_jax"),
                     ("base", 2, "transformers"), ("large", 1, "bert_jax"), ("large", 1, "transformers"),
                     ("large", 2, "bert_jax"), ("large", 2, "transformers"),
                     ("large", 1, "transformers+compile"), ("large", 2, "transformers+compile"),
                     ("large", 1, "bert_jax[kernels=reference]"), ("large", 2, "bert_jax[kernels=reference]")]
    assert len(device_check.plan(_args(no_peer=True, peer_compile=True))) == 4  # no peer: no compiled peer either


def test_table_orders_rows_and_gives_ratios_to_the_eager_peer(tmp_path, capsys):
    args = _args(sizes="base", phases="1", out=str(tmp_path / "out.json"))
    report = device_check.Report(args, {"device_kind": "test"}, peak=1e15)
    measured = dict(size="base", phase=1, rows=256, padding=0.0, mfu=0.5, compile_s=None)
    report.add(dict(measured, side="transformers", sequences_per_second=100.0, useful_tokens_per_second=12800.0,
                    ms_per_step=2560.0, note="torch eager, sdpa"))
    report.add(dict(measured, side="bert_jax", sequences_per_second=300.0, useful_tokens_per_second=38400.0,
                    ms_per_step=853.3, compile_s=42.0, note="gpu: flash_gpu"))
    report.add(dict(size="base", phase=1, side="bert_jax[kernels=reference]", note="skipped: deadline"))
    report.finish("done")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| base")]
    assert lines == [
        "| base | 1 | bert_jax | 256 | 300.0 | 38,400 | 0.0% | 50.0% | 853.3 | 42.0 | 3.00x | gpu: flash_gpu |",
        "| base | 1 | bert_jax[kernels=reference] | - | - | - | - | - | - | - | - | skipped: deadline |",
        "| base | 1 | transformers | 256 | 100.0 | 12,800 | 0.0% | 50.0% | 2560.0 | - | 1.00x | torch eager, sdpa |"]
    assert len(json.loads((tmp_path / "out.json").read_text())["rows"]) == 3
    report.finish("again")  # printed once
    assert capsys.readouterr().out == ""


def test_a_row_past_the_deadline_is_skipped_with_a_line(capsys):
    args = _args(sizes="tiny", deadline_s=1e-3)
    report = device_check.Report(args, {"device_kind": "test"}, peak=None)
    device_check.measure("tiny", 1, device_check.Side("bert_jax", "bert_jax"), args, report,
                         device_check.Watchdog(report, 0))
    assert capsys.readouterr().out.startswith("tiny phase 1 bert_jax: skipped (deadline 0 s passed at ")
    assert report.rows == [{"size": "tiny", "phase": 1, "side": "bert_jax", "settings": {},
                            "note": "skipped: deadline"}]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_the_hard_deadline_prints_the_table_and_exits():
    """The watchdog ends a row that overruns (here the first, at once) with the table of the rows done."""
    result = _run(*SMOKE, "--phases", "1", "--hard_deadline_s", "1")
    assert result.returncode == 3, result.stderr[-3000:]
    assert "hard deadline 1 s: stopped while " in result.stdout
    assert "| size | phase | side | rows | seq/s | useful tok/s | padding | MFU | ms/step | compile s | " \
           "ratio vs peer | note |" in result.stdout


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_run_prints_every_row(tmp_path):
    """The kernel checks (Pallas's interpreter and XLA's lowering of the cuDNN call on the CPU) within their bound,
    then every default row measured and in the closing table and the JSON."""
    out = tmp_path / "check.json"
    result = _run(*SMOKE, "--gpu_tests", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("env: jax ")
    checks = [line for line in result.stdout.splitlines() if line.startswith(("  flash_gpu", "  cudnn",
                                                                               "  layer_norm_gpu"))]
    assert len(checks) == 5 and all(line.rstrip().endswith("s with compilation)") and " ok (" in line
                                    for line in checks), result.stdout
    table = result.stdout[result.stdout.index("| size |"):].splitlines()
    assert len(table) == 4 and table[2].startswith("| tiny | 1 | bert_jax | 8 |") \
        and table[3].startswith("| tiny | 2 | bert_jax | 2 |"), result.stdout
    for line in ("tiny phase 1 bert_jax: 8 rows, ", "tiny phase 2 bert_jax: 2 rows, "):
        assert line in result.stdout and "compile " in result.stdout
    saved = json.loads(out.read_text())
    assert [(r["phase"], r["rows"]) for r in saved["rows"]] == [(1, 8), (2, 2)]
    assert all(r["compile_s"] > 0 and r["ms_per_step"] > 0 for r in saved["rows"])
    assert len(saved["kernel_checks"]) == 5 and all(c["ok"] for c in saved["kernel_checks"])
