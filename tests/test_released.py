"""Released checkpoints by name (`bert_jax.checkpoints.released`): a Hugging Face model id read from a local
huggingface_hub cache built here (HF_HUB_OFFLINE=1, set by conftest), and Google's zips served by a local HTTP
server standing in for storage.googleapis.com (BERT_JAX_RELEASED_URL), sha256-checked and cached, through the
commands users type.

Truth: transformers' own outputs of the tiny models (saved by transformers, or written under google-research/bert's
variable names by test_tf_checkpoint's helpers), the bytes of the files zipped, and google-research/bert's casing
rule (`ORIGINAL_LOWER` / `ORIGINAL_CASED`, copied from its tokenization.validate_case_matches_checkpoint). Nothing
reaches the network.
"""

import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile

import huggingface_hub
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.checkpoints import convert, released, sources
from bert_jax.configs import glue as glue_config
from bert_jax.model import modeling
from test_tf_checkpoint import BERT_CONFIG, VOCAB, _google_variables, _write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# google-research/bert tokenization.validate_case_matches_checkpoint's two lists.
ORIGINAL_LOWER = ["uncased_L-24_H-1024_A-16", "uncased_L-12_H-768_A-12", "multilingual_L-12_H-768_A-12",
                  "chinese_L-12_H-768_A-12"]
ORIGINAL_CASED = ["cased_L-12_H-768_A-12", "cased_L-24_H-1024_A-16", "multi_cased_L-12_H-768_A-12"]
REPO = "test-org/tiny-bert-cased"
REVISION = "0123456789abcdef0123456789abcdef01234567"
SMALL = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
WWM = "wwm_cased_L-24_H-1024_A-16"  # a registered name without a published sha256: SHA256SUMS lists the test's
SMALL_BERT = "uncased_L-2_H-128_A-2"  # likewise, zipped without a folder, as the 2020 zips are
OFFICIAL = "cased_L-12_H-768_A-12"  # a name with published sha256: the test's zip must be refused


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """huggingface_hub's cache layout (models--<org>--<name>/snapshots/<revision>, refs/main) holding a tiny
    cased BertForPreTraining saved by transformers -> (the cache, the model)."""
    torch.manual_seed(0)
    hub = tmp_path_factory.mktemp("hf_hub")
    model = transformers.BertForPreTraining(transformers.BertConfig(**SMALL)).eval()
    repo = hub / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    model.save_pretrained(snapshot)
    (snapshot / "vocab.txt").write_text("\n".join(VOCAB + ["The", "Cat"]) + "\n", encoding="utf-8")
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return hub, model


def _zip(source, archive, folder):
    """The files of `source` into `archive`, under `folder/` (the 2018-2019 zips) or at the root (folder None)."""
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(source.iterdir()):
            z.write(path, f"{folder}/{path.name}" if folder else path.name)
    return hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def google_server(tmp_path_factory):
    """Google-format zips of a tiny transformers BertForPreTraining (bert_config.json, vocab.txt, bert_model.ckpt.*)
    served over HTTP on 127.0.0.1, and a SHA256SUMS listing them -> dict(url, sums, model, source, requests)."""
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(transformers.BertConfig(**BERT_CONFIG)).eval()
    tmp = tmp_path_factory.mktemp("google")
    source = _write_checkpoint(tmp / "checkpoint", _google_variables(model), optimizer=False)
    served = tmp / "served"
    served.mkdir()
    hashes = {name: _zip(source, served / f"{name}.zip", folder)
              for name, folder in ((WWM, WWM), (SMALL_BERT, None), (OFFICIAL, OFFICIAL))}
    sums = tmp / "SHA256SUMS"
    sums.write_text("".join(f"{h}  {name}.zip\n" for name, h in hashes.items()))
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield dict(url=f"http://127.0.0.1:{server.server_address[1]}", sums=sums, model=model, source=source,
               requests=requests)
    server.shutdown()
    server.server_close()


@pytest.fixture
def names_env(hf_cache, google_server, tmp_path, monkeypatch):
    """This process and its commands read names from the test's caches and server only -> the environment."""
    env = {"BERT_JAX_CACHE": str(tmp_path / "cache"), "BERT_JAX_RELEASED_URL": google_server["url"],
           "BERT_JAX_RELEASED_SHA256SUMS": str(google_server["sums"]), "HF_HUB_CACHE": str(hf_cache[0]),
           "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_cache[0]))  # read at its import
    return dict(os.environ, JAX_PLATFORMS="cpu", **env)


def _run(*args, env):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_names_follow_the_original_casing_rule_and_paths_come_first(google_server, names_env, tmp_path,
                                                                   monkeypatch):
    """google-research/bert's rule on a checkpoint's folder name; Hugging Face's id syntax; an existing path is
    never a name; a TensorFlow directory unzipped by hand gets its casing from its name."""
    for name in ORIGINAL_LOWER + ORIGINAL_CASED:
        expected = name in ORIGINAL_LOWER
        assert released.casing(f"/data/{name}/bert_model.ckpt") is expected
        assert released.casing(f"{name}/bert_model.ckpt") is expected
        assert released.GOOGLE[name].do_lower_case is expected and released.kind(name) == "google"
        assert len(released.GOOGLE[name].sha256) == 4  # published: every file read is checked
    assert released.casing(f"/data/{WWM}/bert_model.ckpt") is False
    assert released.casing(f"/data/{SMALL_BERT}/bert_model.ckpt") is True
    assert released.casing("/data/my_model/bert_model.ckpt") is None
    assert len([n for n in released.GOOGLE if n.startswith("uncased_L-") and "2020_02_20" in released.GOOGLE[n].url]) == 23
    for name in ("bert-base-uncased", "google-bert/bert-large-cased", f"{REPO}@{REVISION}", "org/name@refs/pr/1"):
        assert released.kind(name) == "hf", name
    for name in ("a/b/c", "./model", "/abs/path", "name@", "foo--bar", "x" * 97, "gs://bucket/model"):
        assert released.kind(name) is None, name

    model = glue_config.get_config("mrpc").model
    local = tmp_path / OFFICIAL  # Google's cased BERT-Base unzipped by hand: no tokenizer_config.json
    shutil.copytree(google_server["source"], local)
    init = sources.resolve(str(local), model)
    assert init.do_lower_case is False and init.vocab_file == str(local / "vocab.txt")
    assert sources.vocabulary(init, "", False)[1] is False  # was refused as a conflict
    with pytest.raises(ValueError) as e:
        sources.vocabulary(init, "", True)
    message = _one_line(str(e.value))
    assert "do_lower_case=True conflicts with config.init_checkpoint=" in message and OFFICIAL in message
    assert message.endswith("pre-trained with do_lower_case=False")

    monkeypatch.chdir(tmp_path)  # a folder named like a model id is read as the folder
    shutil.copytree(google_server["source"], tmp_path / "test-org" / "tiny-bert-cased")
    assert sources.resolve(REPO, model).config.hidden_size == BERT_CONFIG["hidden_size"]
    assert not (tmp_path / "cache").exists()  # nothing was downloaded


def test_hugging_face_id_from_the_cache_offline(hf_cache, names_env):
    """An id (and id@revision) is huggingface_hub's cached snapshot: transformers' outputs, its casing; an id the
    cache lacks is one line naming it and the cache."""
    _, model = hf_cache
    job = glue_config.get_config("mrpc").model
    init = sources.resolve(REPO, job)
    assert init.kind == "hf" and init.path == REPO and init.do_lower_case is False
    assert init.vocab_file.endswith(f"snapshots/{REVISION}/vocab.txt")
    assert sources.resolve(f"{REPO}@{REVISION}", job).vocab_file == init.vocab_file
    ids = np.random.default_rng(0).integers(5, SMALL["vocab_size"], size=(2, 9))
    ours = modeling.BertModel(init.config).apply({"params": init.params["bert"]}, jnp.asarray(ids, jnp.int32),
                                                  jnp.zeros((2, 9), jnp.int32), jnp.ones((2, 9), jnp.int32))
    with torch.no_grad():
        theirs = model.bert(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert np.abs(np.asarray(ours.sequence_output) - theirs).max() < 1e-5
    with pytest.raises(ValueError) as e:
        sources.vocabulary(init, "", True)
    assert f"init_checkpoint={REPO!r}, pre-trained with do_lower_case=False" in _one_line(str(e.value))

    for name in ("test-org/absent", f"{REPO}@v2"):
        with pytest.raises(FileNotFoundError) as e:
            sources.resolve(name, job)
        message = _one_line(str(e.value))
        assert name in message and str(hf_cache[0]) in message and "HF_HUB_OFFLINE=1" in message


@pytest.mark.integration
@pytest.mark.slow
def test_convert_and_extract_features_by_name(google_server, hf_cache, names_env, tmp_path):
    """`convert from_hf <id>`, `convert from_tf <Google name>` (downloaded once, checked, cached, cased), then
    `extract_features --init_checkpoint=<Google name>` from the cache: transformers' outputs, cased tokens."""
    result = _run("bert_jax.convert", "from_hf", f"--input={REPO}", f"--output_dir={tmp_path / 'from_hf'}",
                  env=names_env)
    assert result.returncode == 0, result.stderr[-2000:]
    snapshot = hf_cache[0] / f"models--{REPO.replace('/', '--')}" / "snapshots" / REVISION
    assert json.loads((tmp_path / "from_hf" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert (tmp_path / "from_hf" / "vocab.txt").read_bytes() == (snapshot / "vocab.txt").read_bytes()

    result = _run("bert_jax.convert", "from_tf", f"--input={WWM}", f"--output_dir={tmp_path / 'from_tf'}",
                  env=names_env)
    assert result.returncode == 0, result.stderr[-2000:]
    cached = tmp_path / "cache" / "google" / WWM
    assert f"{WWM}: downloaded {google_server['url']}/{WWM}.zip (sha256 checked) into {cached}" in result.stderr
    assert sorted(p.name for p in cached.iterdir()) == sorted(p.name for p in google_server["source"].iterdir())
    for path in google_server["source"].iterdir():
        assert (cached / path.name).read_bytes() == path.read_bytes(), path.name
    assert sorted(os.listdir(cached.parent)) == [WWM]  # no temporary left
    assert json.loads((tmp_path / "from_tf" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    assert google_server["requests"].count(f"/{WWM}.zip") == 1

    lines = ["The cat sat ||| on the mat .", "the Dog sat"]
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _run("bert_jax.extract_features", f"--input_file={tmp_path / 'input.txt'}",
                  f"--output_file={tmp_path / 'features.npz'}", f"--init_checkpoint={WWM}", "--layers=-1",
                  "--output_format=npz", "--max_seq_length=16", "--num_devices=1", env=names_env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert google_server["requests"].count(f"/{WWM}.zip") == 1  # read from the cache
    tokenizer = transformers.BertTokenizer(str(google_server["source"] / "vocab.txt"), do_lower_case=False)
    with np.load(tmp_path / "features.npz") as features:
        for i, line in enumerate(lines):
            encoded = tokenizer(*line.split(" ||| "), return_tensors="pt")
            tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
            assert features[f"tokens_{i}"].tolist() == tokens
            assert "[UNK]" in tokens  # "The", "Dog": cased, and the vocabulary has "the", "dog" only
            with torch.no_grad():
                expected = google_server["model"].bert(**encoded).last_hidden_state[0].numpy()
            assert np.abs(features[f"features_{i}"][:, 0] - expected).max() < 1e-5


def test_refusals_are_one_line_and_leave_nothing(google_server, names_env, tmp_path, monkeypatch, capsys):
    """Published sha256 enforced whatever the mirror and SHA256SUMS say; a zip differing from SHA256SUMS; a name
    without any sha256; a download failure; an id offline without a cache: one line from the command, no file."""
    def refused(args, *parts):
        assert convert.main(args) == 1
        line = _one_line(capsys.readouterr().err)
        assert line.startswith("convert: ") and all(p in line for p in parts), line

    out = f"--output_dir={tmp_path / 'out'}"
    refused(["from_tf", f"--input={OFFICIAL}", out], f"{OFFICIAL}: bert_config.json of {google_server['url']}/",
            f"published {released.PUBLISHED_SHA256[OFFICIAL][0]}", "nothing was written")
    wrong = tmp_path / "WRONG_SUMS"
    wrong.write_text(f"{'0' * 64}  {SMALL_BERT}.zip\n")
    monkeypatch.setenv("BERT_JAX_RELEASED_SHA256SUMS", str(wrong))
    refused(["from_tf", f"--input={SMALL_BERT}", out], f"{SMALL_BERT}.zip has sha256 ", f"lists {'0' * 64}")
    monkeypatch.delenv("BERT_JAX_RELEASED_SHA256SUMS")
    refused(["from_tf", f"--input={WWM}", out], "no published sha256 is known", "BERT_JAX_RELEASED_SHA256SUMS")
    refused(["from_tf", "--input=chinese_L-12_H-768_A-12", out], "chinese_L-12_H-768_A-12 is not in the cache",
            f"{google_server['url']}/chinese_L-12_H-768_A-12.zip: HTTP 404")
    refused(["from_hf", "--input=test-org/absent", out], "'test-org/absent'", names_env["HF_HUB_CACHE"],
            "HF_HUB_OFFLINE=1")
    refused(["from_hf", f"--input={WWM}", out], "use from_tf")
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path / "cache" / "google") == []  # the refused downloads left nothing

    monkeypatch.setenv("BERT_JAX_RELEASED_SHA256SUMS", str(google_server["sums"]))
    init = sources.resolve(SMALL_BERT, glue_config.get_config("mrpc").model)  # a zip without a folder
    assert init.do_lower_case is True and init.config.hidden_size == BERT_CONFIG["hidden_size"]
    assert os.listdir(tmp_path / "cache" / "google") == [SMALL_BERT]
