"""impl="splash" (JAX's splash attention TPU kernel) in the Pallas interpreter on CPU against
the float64 NumPy reference (values and gradients), and its refusals by name; on a TPU also
compiled for it (marker `tpu`, tests/accelerators.py)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxformer.ops.attention import dot_product_attention, resolve_impl
from tests import accelerators
from tests import attention_reference as ref
from tests.user_errors import user_error

# splash's blocks are multiples of 128 lanes: 128 positions is one block, 256 two (so causal
# skips one (q block, kv block) pair and the window/segment cases cross a block border).
CASES = {
    "causal_gqa2": (dict(b=1, tq=256, tk=256, h=4, hkv=2, d=64), dict(causal=True)),
    "mqa_window_segments": (dict(b=2, tq=128, tk=128, h=2, hkv=1, d=64),
                            dict(causal=True, window=40,
                                 segment_ids=ref.sorted_segments(2, 128, 3))),
    # queries are the last 128 of 256 keys; a two-sided window; scale set
    "cross_length_window_mha": (dict(b=1, tq=128, tk=256, h=2, hkv=2, d=128),
                                dict(window=(30, 20), scale=0.2)),
}


def _splash(*args, **kw):
  return dot_product_attention(*args, impl="splash", **kw)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_grads_match_float64_reference(name):
  _check_against_reference(name)


@pytest.mark.tpu
@pytest.mark.parametrize("name", ["causal_gqa2", "mqa_window_segments"])
def test_splash_compiled_for_the_tpu_matches_float64_reference(name):
  """The same cases as Mosaic kernels on a TPU (not interpreted), float32 at `highest`."""
  shape_kw, kw = CASES[name]
  with accelerators.on_device("tpu"):
    q, k, v, _ = ref.random_inputs(**shape_kw)
    accelerators.assert_kernel_compiled("tpu", lambda q, k, v: _splash(q, k, v, **kw), q, k, v)
    _check_against_reference(name)


def _check_against_reference(name):
  shape_kw, kw = CASES[name]
  q, k, v, d_out = ref.random_inputs(**shape_kw)
  expected, _ = ref.attention(q, k, v, **ref.reference_kwargs(kw))
  want = ref.attention_grads(q, k, v, d_out, **ref.reference_kwargs(kw))
  grads, out = ref.grad_fn(kw, _splash)(q, k, v, d_out)
  ref.assert_matches(out, grads, expected, want)


def test_rows_with_no_visible_key_are_zero():
  """Causal with more queries than keys: the first queries see nothing (splash alone would
  average every key there)."""
  q, k, v, d_out = ref.random_inputs(b=1, tq=256, tk=128, h=2, hkv=2, d=64)
  kw = dict(causal=True)
  grads, out = ref.grad_fn(kw, _splash)(q, k, v, d_out)
  ref.assert_matches(out, grads, ref.attention(q, k, v, **kw)[0],
                     ref.attention_grads(q, k, v, d_out, **kw))
  np.testing.assert_array_equal(np.asarray(out)[:, :128], 0)


@pytest.mark.parametrize("kwargs, shapes, parts", [
    (dict(bias=np.zeros((1, 2, 128, 128), np.float32)), {}, ("no additive bias", "'pallas'")),
    (dict(mask=np.ones((1, 1, 128, 128), bool)), {}, ("no dense boolean mask",)),
    (dict(segment_ids=(np.zeros((1, 128), np.int32), np.zeros((1, 128), np.int32))), {},
     ("segment_ids must be one",)),
    ({}, dict(tq=100, tk=100), ("multiples of 128", "Tq=100", "model.max_len")),
    (dict(block_sizes=(128, 96)), {}, ("block_k=96 (model.attention_block_sizes)",)),
])
def test_what_splash_cannot_take_is_refused_by_name(kwargs, shapes, parts):
  shape = dict(b=1, tq=128, tk=128, h=2, hkv=2, d=64) | shapes
  q, k, v, _ = ref.random_inputs(**shape)
  user_error(lambda: dot_product_attention(q, k, v, impl="splash", **kwargs),
             "impl='splash'", *parts)


def test_float16_is_refused_and_auto_on_cpu_stays_off_the_kernels():
  q, k, v, _ = ref.random_inputs(b=1, tq=128, tk=128, h=2, hkv=2, d=64)
  user_error(lambda: dot_product_attention(*(x.astype(np.float16) for x in (q, k, v)),
                                           impl="splash"), "float32 or bfloat16")
  assert resolve_impl("auto", q, k, v) == "xla"
