"""`python -m jaxformer.serve`'s HTTP API against a server started on localhost (an ephemeral
port) with a real HTTP client (urllib): completions equal `inference.generate`'s tokens (and
`sample`'s text) for the same prompt and seed (greedy and sampled, alone and in one batch),
streaming yields the same text, bad requests are a 400 naming the field, and the server shuts
down cleanly (the fixture's teardown). The run is written directly (`tests.runs.write_run`,
random params), once per module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from jaxformer import cli, inference
from jaxformer.data import tokenizers
from jaxformer.inference import quantize
from jaxformer.serve import Server, check_run, engine_for, load
from jaxformer.serve.api import generate_seed
from tests.repo_root import REPO
from tests.runs import tiny_run_config, write_run

TEXT = open(os.path.join(str(REPO), "jaxformer", "data", "assets", "tinyshakespeare.txt"),
            encoding="utf-8").read()
CHARS = tokenizers.CharTokenizer(TEXT)
TIMEOUT = 120          # seconds: a stuck server fails the test instead of hanging it


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("serve") / "run")
  write_run(workdir, tiny_run_config(), CHARS, random=True)
  return workdir


@pytest.fixture(scope="module")
def served(run):
  """(server, config, params, tokenizer), the server on an ephemeral localhost port."""
  config, params, tokenizer, _ = load(run)
  server = Server(engine_for(config, params, tokenizer, max_batch=4, batch_window_s=0.05),
                  tokenizer, "tiny", port=0).start()
  yield server, config, params, tokenizer
  _close_cleanly(server)


def _close_cleanly(server):
  """close() returns within TIMEOUT (no hang), the engine's worker has stopped and the port
  no longer answers."""
  done = threading.Event()
  threading.Thread(target=lambda: (server.close(timeout=TIMEOUT), done.set()),
                   daemon=True).start()
  assert done.wait(TIMEOUT), "server.close() hung"
  assert not server.engine._thread.is_alive()
  with pytest.raises(urllib.error.URLError):
    urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5)


def _post(server, body, raw: bytes | None = None):
  """(status, parsed JSON body) of POST /v1/completions."""
  data = raw if raw is not None else json.dumps(body).encode()
  req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions", data=data,
                               headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
      return resp.status, json.loads(resp.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def _get(server, path):
  with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=TIMEOUT) as r:
    return r.status, json.loads(r.read())


def _expected(config, params, tokenizer, prompt, n, temperature, seed, **kw):
  """`inference.generate`'s new tokens, with the seed `sample` uses for `seed`."""
  ids = tokenizer.encode(prompt)
  out = inference.generate(config.model, params, ids, max_new_tokens=n,
                           temperature=temperature, seed=generate_seed(seed),
                           vocab_limit=tokenizer.vocab_size, **kw)
  return out[len(ids):].tolist()


def test_completions_equal_generate_alone_and_batched(served):
  server, config, params, tokenizer = served
  # one prompt length and one max_tokens: `generate` compiles once per sampling setting
  cases = [("ROMEO", 6, 0.0, 0, {}), ("To be", 6, 1.0, 7, {}),
           ("Hi yo", 6, 0.8, 123, {"top_k": 5}), ("First", 6, 1.3, 3, {})]
  results = [None] * len(cases)

  def ask(i):
    prompt, n, t, seed, kw = cases[i]
    results[i] = _post(server, dict(prompt=prompt, max_tokens=n, temperature=t, seed=seed,
                                    **kw))
  before = len(server.engine.batches)
  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(cases))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(TIMEOUT)
  batches = server.engine.batches[before:]
  assert max(batches) >= 2, batches               # some requests shared a batch
  for (prompt, n, t, seed, kw), (status, body) in zip(cases, results):
    assert status == 200, body
    choice = body["choices"][0]
    want = _expected(config, params, tokenizer, prompt, n, t, seed, **kw)
    assert choice["token_ids"] == want, (prompt, choice["token_ids"], want)
    assert choice["text"] == tokenizer.decode(want)
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": n,
                             "total_tokens": len(prompt) + n}
  # `python -m jaxformer.sample`'s text for the same prompt, seed and settings
  prompt, n, t, seed, kw = cases[3]
  assert results[3][1]["choices"][0]["text"] == inference.sample_text(
      config, params, tokenizer, prompt=prompt, max_new_tokens=n, temperature=t,
      seed=seed)[len(prompt):]
  # a prompt given as token ids is the same request
  status, body = _post(server, dict(prompt=tokenizer.encode("ROMEO").tolist(), max_tokens=6,
                                    temperature=0))
  assert status == 200 and body["choices"][0]["token_ids"] == _expected(
      config, params, tokenizer, "ROMEO", 6, 0.0, 0)


def test_stream_yields_the_same_text(served):
  server, config, params, tokenizer = served
  body = dict(prompt="KING:", max_tokens=6, temperature=0.9, seed=5, stream=True)
  req = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/completions",
                               data=json.dumps(body).encode())
  with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
    assert resp.headers["Content-Type"] == "text/event-stream"
    lines = resp.read().decode().split("\n\n")
  events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
  assert events[-1] == "[DONE]"
  chunks = [json.loads(e) for e in events[:-1]]
  assert all(c["object"] == "text_completion" for c in chunks)
  assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
  text = "".join(c["choices"][0]["text"] for c in chunks)
  assert text == tokenizer.decode(_expected(config, params, tokenizer, "KING:", 6, 0.9, 5))
  assert len(chunks) >= 6                       # one event per token (a char tokenizer)


@pytest.mark.parametrize("body, param", [
    (dict(prompt="", max_tokens=2), "prompt"),
    (dict(prompt=["a"], max_tokens=2), "prompt"),
    (dict(prompt=[1, 10**6], max_tokens=2), "prompt"),
    (dict(max_tokens=2), "prompt"),
    (dict(prompt="a", max_tokens=0), "max_tokens"),
    (dict(prompt="a", max_tokens="3"), "max_tokens"),
    (dict(prompt="a", max_tokens=10**6), "max_tokens"),
    (dict(prompt="a", temperature=-1), "temperature"),
    (dict(prompt="a", temperature=True), "temperature"),
    (dict(prompt="a", top_p=0), "top_p"),
    (dict(prompt="a", top_k=0), "top_k"),
    (dict(prompt="a", seed=1.5), "seed"),
    (dict(prompt="a", seed=-1), "seed"),
    (dict(prompt="a", n=2), "n"),
    (dict(prompt="a", stream="yes"), "stream"),
    (dict(prompt="a", stop=["\n"]), "stop"),
    (dict(prompt="a", model="gpt-4"), "model"),
    (dict(prompt="a", frobnicate=1), "frobnicate"),
])
def test_bad_request_is_a_400_naming_the_field(served, body, param):
  server = served[0]
  status, answer = _post(server, body)
  assert status == 400, answer
  assert answer["error"]["param"] == param and answer["error"]["type"] == \
      "invalid_request_error"
  assert param in answer["error"]["message"]


def test_malformed_bodies_and_paths(served):
  server = served[0]
  status, answer = _post(server, None, raw=b"{not json")
  assert status == 400 and "JSON" in answer["error"]["message"]
  status, answer = _post(server, None, raw=b"[1, 2]")
  assert status == 400 and answer["error"]["param"] is None
  with pytest.raises(urllib.error.HTTPError) as info:
    urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v2/nothing", timeout=TIMEOUT)
  assert info.value.code == 404 and "error" in json.loads(info.value.read())
  assert _get(server, "/health") == (200, {"status": "ok"})
  status, models = _get(server, "/v1/models")
  assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]
  # still serving after all of that
  status, body = _post(server, dict(prompt="a", max_tokens=2, temperature=0))
  assert status == 200 and len(body["choices"][0]["token_ids"]) == 2


@pytest.mark.slow
def test_int8_server(run):
  """--int8: the int8 params' tokens equal `generate` on the same int8 params (~30 s on a
  loaded 2-core machine: its own compilations)."""
  import jax
  config, params, tokenizer, _ = load(run, int8=True)
  assert any(isinstance(x, quantize.Int8Kernel) for x in jax.tree.leaves(
      params, is_leaf=lambda x: isinstance(x, quantize.Int8Kernel)))
  server = Server(engine_for(config, params, tokenizer), tokenizer, "tiny", port=0).start()
  try:
    status, body = _post(server, dict(prompt="ROMEO:", max_tokens=5, temperature=0.7,
                                      seed=2))
    assert status == 200
    assert body["choices"][0]["token_ids"] == _expected(config, params, tokenizer, "ROMEO:",
                                                        5, 0.7, 2)
  finally:
    _close_cleanly(server)


def test_cli_user_mistakes_are_one_line_before_compiling(run, tmp_path, capsys, monkeypatch):
  """The command line once through a subprocess (a bad workdir: exit 2, one line); the other
  mistakes through `check_run` in the CLI's wrapper in-process, with compiling refused."""
  result = subprocess.run([sys.executable, "-m", "jaxformer.serve",
                           f"--workdir={tmp_path / 'missing'}", "--port=0"],
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=str(REPO),
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == cli.EXIT_USER_ERROR, result.stderr
  assert result.stderr.strip().splitlines() == [
      f"error: --workdir={str(tmp_path / 'missing')!r} holds no training run (no config.json);"
      " train a decoder there first"]
  import jax

  def refuse(*a, **k):
    raise AssertionError("compiled before refusing the input")
  monkeypatch.setattr(jax, "jit", refuse)
  bert = tmp_path / "bert"
  bert.mkdir()
  cfg = tiny_run_config()
  cfg.model.family = "bert"
  (bert / "config.json").write_text(cfg.to_json())
  for workdir, which, fragment in [(str(bert), "latest", "decoder LMs"),
                                   (run, "newest", "--checkpoint='newest'")]:
    with pytest.raises(SystemExit) as info:
      cli.user_errors(lambda: check_run(workdir, which))()
    assert info.value.code == cli.EXIT_USER_ERROR
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and fragment in err, err


def test_warmup_shapes_are_checked():
  from jaxformer.serve import warmup_shapes
  assert warmup_shapes(["64:1", "32:32"], 64) == [(64, 1), (32, 32)]
  for item, fragment in [("64", "PROMPT:NEW"), ("0:4", "PROMPT:NEW"), ("a:b", "PROMPT:NEW"),
                         ("60:10", "model.max_len=64")]:
    with pytest.raises(ValueError, match=fragment):
      warmup_shapes([item], 64)
