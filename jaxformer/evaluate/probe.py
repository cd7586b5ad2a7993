"""A linear probe of a trained encoder: frozen features, a logistic regression fitted on a
labelled train split, its accuracy on train and test.

Features:
- ViT: the final-norm output pooled as the model pools (its [CLS] row, or the mean over
  patches with pool='gap'): what the classification head reads; images from the run's
  data.source (or another image source), standardised with the train split's statistics as
  training does, the train split (data.train_split) and the eval split (data.eval_split);
- BERT family (bert, roberta, deberta; electra's discriminator): the last layer's output averaged over the text's
  tokens; the text from JSONL lines {"text": str, "label": int or str} (`--data`, and
  `--test_data`, else a seeded 80/20 split of `--data`), cut to data.seq_len tokens.

The regression: features standardised (train mean and std), a softmax layer fitted full-batch
with Adam on the mean cross-entropy + `l2` x |W|^2, a fixed number of steps from zeros, in
one jitted loop: deterministic, no scikit-learn needed.
"""

from __future__ import annotations

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer import jsonfile, models, paths, run_settings, tasks

TEXT_FAMILIES = ("bert", "roberta", "deberta", "electra")
IMAGE_FAMILIES = ("vit",)
FAMILIES = TEXT_FAMILIES + IMAGE_FAMILIES
FEATURE_BATCH = 128


def check_family(config):
  family = models.settings_of(config).family
  if family not in FAMILIES:
    raise ValueError(f"--task=linear_probe probes encoders ({', '.join(FAMILIES)}); this run "
                     f"is model.family={family!r}" + (
                         "; for a decoder use --task=perplexity, multiple_choice or lm_eval"
                         if family == "decoder" else ""))
  return family


def _batched(fn, inputs: list[np.ndarray], batch: int = FEATURE_BATCH) -> np.ndarray:
  """fn over rows of `inputs` in fixed-size batches (the last padded), concatenated."""
  n, out = len(inputs[0]), []
  for start in range(0, n, batch):
    parts = [x[start:start + batch] for x in inputs]
    pad = batch - len(parts[0])
    if pad:
      parts = [np.concatenate([p, np.repeat(p[:1], pad, axis=0)]) for p in parts]
    out.append(np.asarray(fn(*parts))[:batch - pad])
  return np.concatenate(out)


def image_features(config, params, splits: list[np.ndarray]) -> list[np.ndarray]:
  """[N, E] pooled final-norm features of each array of standardised images [N, H, W, C]
  (one compilation for all of them)."""
  m = models.settings_of(config)
  module = models.build(m)

  @jax.jit
  def features(x):
    _, state = module.apply({"params": params}, x, deterministic=True,
                            capture_intermediates=lambda mdl, _: mdl.name == "final_norm",
                            mutable=["intermediates"])
    h = state["intermediates"]["final_norm"]["__call__"][0]
    return h[:, 0] if m["pool"] == "cls" else h.mean(axis=1)
  return [_batched(features, [images.astype(np.float32)]) for images in splits]


def text_features(config, params, tokenizer, texts: list[str], where: list[str]) -> np.ndarray:
  """[N, E] mean over tokens of the encoder's last layer."""
  m = models.settings_of(config)
  module = models.build(m)
  length = int(run_settings.parse_section("data", config.data).seq_len or m["max_len"])
  pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
  if m.get("pad_id") is not None:
    pad = int(m["pad_id"])
  tokens = np.full((len(texts), length), pad, np.int32)
  mask = np.zeros((len(texts), length), np.int32)
  for i, (text, at) in enumerate(zip(texts, where)):
    try:
      ids = tokenizer.encode(text)[:length]
    except ValueError as e:
      raise ValueError(f"{at}: {e}") from None
    if not len(ids):
      raise ValueError(f"{at}: the text encodes to no tokens")
    tokens[i, :len(ids)], mask[i, :len(ids)] = ids, 1

  @jax.jit
  def features(t, a):
    out = module.apply({"params": params}, t, attention_mask=a, deterministic=True,
                       method=module.encode)
    h = out[0] if isinstance(out, tuple) else out
    w = a[..., None].astype(h.dtype)
    return (h * w).sum(1) / w.sum(1)
  return _batched(features, [tokens, mask])


def read_labelled(path: str) -> tuple[list[str], list, list[str]]:
  """(texts, labels, file:line of each) of a JSONL file of {"text", "label"} lines."""
  records = jsonfile.read_jsonl(paths.path(path, "--data"), name=os.fspath(path), field="--data",
                                holds='{"text": str, "label": int or str} lines')
  texts, labels, where = [], [], []
  for at, record in records:
    if not isinstance(record.get("text"), str) or not (
        isinstance(record.get("label"), (int, str)) and not isinstance(record["label"], bool)):
      raise ValueError(f"{at}: expected the keys text (a string) and label (an int or "
                       f"string); got {sorted(record)}")
    texts.append(record["text"])
    labels.append(record["label"])
    where.append(at)
  return texts, labels, where


def fit_logistic(x_train, y_train, num_classes: int, *, l2: float = 1e-2, steps: int = 500,
                 lr: float = 0.05):
  """(W [E, C], b [C], mean, std) of a softmax regression on standardised features."""
  mean, std = x_train.mean(0), x_train.std(0) + 1e-6
  x = jnp.asarray((x_train - mean) / std, jnp.float32)
  y = jnp.asarray(y_train, jnp.int32)
  params = {"w": jnp.zeros((x.shape[1], num_classes)), "b": jnp.zeros(num_classes)}
  opt = optax.adam(lr)

  def loss(p):
    logits = x @ p["w"] + p["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean() + l2 * jnp.sum(
        p["w"] ** 2)

  @jax.jit
  def run(p):
    def body(_, carry):
      p, state = carry
      grads = jax.grad(loss)(p)
      updates, state = opt.update(grads, state, p)
      return optax.apply_updates(p, updates), state
    return jax.lax.fori_loop(0, steps, body, (p, opt.init(p)))[0]
  p = jax.device_get(run(params))
  return p["w"], p["b"], mean, std


def accuracy(w, b, mean, std, x, y) -> float:
  pred = np.argmax(((x - mean) / std) @ w + b, axis=-1)
  return float(np.mean(pred == y))


def _limit(n: int, max_examples: int | None) -> int:
  return n if max_examples is None else min(n, max_examples)


def _probe(x_train, y_train, x_test, y_test, num_classes: int, l2: float) -> dict:
  w, b, mean, std = fit_logistic(x_train, y_train, num_classes, l2=l2)
  return {"train_examples": int(len(y_train)), "test_examples": int(len(y_test)),
          "classes": int(num_classes), "features": int(x_train.shape[1]),
          "train_accuracy": accuracy(w, b, mean, std, x_train, y_train),
          "test_accuracy": accuracy(w, b, mean, std, x_test, y_test),
          "majority_class": float(np.mean(y_test == np.bincount(y_train).argmax()))}


def evaluate_images(config, params, *, source: str | None = None,
                    max_examples: int | None = None, l2: float = 1e-2) -> dict:
  from jaxformer.data.images.pipeline import open_source
  data = tasks.saved_run_data(config)          # ImageSettings of a classification run
  if source is not None:
    data = dataclasses.replace(data, source=source)
  src = open_source(data, data_dir=data.data_dir)
  train_split, test_split = data.train_split, data.eval_split
  src.check_split(train_split, "data.train_split")
  src.check_split(test_split, "data.eval_split")
  mean, std = src.stats(train_split)
  images, labels = [], []
  for split in (train_split, test_split):
    x, y = src.split_arrays(split)
    n = _limit(len(y), max_examples)
    images.append((x[:n].astype(np.float32) / 255.0 - mean) / std)
    labels.append(y[:n])
  features = image_features(config, params, images)
  arrays = {train_split: (features[0], labels[0]), test_split: (features[1], labels[1])}
  out = _probe(*arrays[train_split], *arrays[test_split], src.num_classes, l2)
  return {"source": src.name, "train_split": train_split, "test_split": test_split, **out}


def evaluate_texts(config, params, tokenizer, *, data: str, test_data: str | None = None,
                   max_examples: int | None = None, l2: float = 1e-2, seed: int = 0) -> dict:
  if tokenizer is None:
    raise ValueError("this run has no tokenizer (tokenizer.json is missing from its workdir)")
  texts, labels, where = read_labelled(data)
  if test_data is not None:
    t_texts, t_labels, t_where = read_labelled(test_data)
    split = len(texts)
    texts, labels, where = texts + t_texts, labels + t_labels, where + t_where
    order = np.arange(len(texts))
  else:
    if len(texts) < 5:
      raise ValueError(f"--data={data!r} holds {len(texts)} examples; a probe splits them "
                       "80/20 and needs 5 or more (or give --test_data)")
    order = np.random.default_rng(seed).permutation(len(texts))
    split = int(round(0.8 * len(texts)))
  names = sorted(set(labels), key=str)
  y = np.array([names.index(label) for label in labels], np.int32)
  train, test = order[:split], order[split:]
  train, test = train[:_limit(len(train), max_examples)], test[:_limit(len(test), max_examples)]
  keep = np.concatenate([train, test])
  x = text_features(config, params, tokenizer, [texts[i] for i in keep],
                    [where[i] for i in keep])
  out = _probe(x[:len(train)], y[train], x[len(train):], y[test], len(names), l2)
  return {"data": os.fspath(data), "test_data": test_data, "labels": [str(n) for n in names],
          **out}


def evaluate(config, params, tokenizer, **kw) -> dict:
  family = check_family(config)
  params = nn.unbox(params)
  if family in IMAGE_FAMILIES:
    for key in ("data", "test_data", "seed"):
      kw.pop(key, None)
    return evaluate_images(config, params, **kw)
  kw.pop("source", None)
  if not kw.get("data"):
    raise ValueError(f"--task=linear_probe on a {family!r} run needs --data=<JSONL of "
                     '{"text": ..., "label": ...} lines> (and optionally --test_data)')
  return evaluate_texts(config, params, tokenizer, **kw)
