"""A run's tokenizer as a Hugging Face one: `tokenizer.json` (the `tokenizers` library's format)
and `tokenizer_config.json`, which `transformers.AutoTokenizer.from_pretrained` loads and which
encode text to the ids jaxformer's tokenizer gives and decode them back to the same text.

- char: a BPE model with one token per character and no merges (so every character is its own
  token; a character outside the vocabulary is dropped, where jaxformer refuses it), decoded by
  concatenation (`Fuse`).
- spm (SentencePiece BPE or unigram as `jaxformer.data.tokenizers` trains it: identity
  normalisation, no dummy prefix, byte fallback, "\\n" a piece of its own): spaces become "▁"
  (a `Replace` normaliser) and nothing splits the text into words, as in SentencePiece.
  Unigram -> `tokenizers`' Unigram with each piece's score; BPE -> `tokenizers`' BPE whose
  merges are every split of each piece into two pieces, ranked by the piece's score
  (SentencePiece merges the adjacent pair whose piece scores highest first). `<0xNN>` byte
  pieces with byte fallback; "\\n" an added token; the control pieces (<pad>, <unk>, <s>,
  </s>) special tokens. Decoder: "▁" -> " ", byte fallback, concatenation.
- hf: the run's own tokenizer.json without its post-processor (jaxformer encodes, and so
  trained on, text without the special tokens a template adds).

Ids a task appends after the tokenizer's vocabulary (MLM's [MASK], T5's sentinels, see
`tokenizers.special_ids`) are added as special tokens under the names the caller gives.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Sequence

from jaxformer import paths
from jaxformer.data import tokenizers as jf_tokenizers
from jaxformer.extras import require

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG)
SPACE = "\u2581"                       # SentencePiece's visible space
# The special-token attributes of a transformers tokenizer.
ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
              "mask_token")


def _hf():
  return require("tokenizers", extra="text", needed_for="exporting a tokenizer")


def _char(tokenizer):
  hf = _hf()
  tok = hf.Tokenizer(hf.models.BPE({c: i for i, c in enumerate(tokenizer.chars)}, []))
  tok.decoder = hf.decoders.Fuse()
  return tok


def _spm(tokenizer):
  hf = _hf()
  sp = tokenizer._sp                    # pylint: disable=protected-access
  pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
  special = [i for i in range(len(pieces)) if sp.is_control(i) or sp.is_unknown(i)]
  user = [sp.piece_to_id(s) for s in jf_tokenizers.SPM_USER_SYMBOLS]
  unk = sp.unk_id()
  if jf_tokenizers.parse_spec(tokenizer.spec)[1][0] == "unigram":     # spm:<type>:<size>
    model = hf.models.Unigram([(p, float(sp.get_score(i))) for i, p in enumerate(pieces)],
                              unk_id=unk, byte_fallback=True)
  else:
    plain = {p for i, p in enumerate(pieces) if not (i in special or i in user
                                                     or sp.is_byte(i) or sp.is_unused(i))}
    merged = sorted((i for i, p in enumerate(pieces) if p in plain and len(p) > 1),
                    key=lambda i: (-sp.get_score(i), i))
    merges = [(pieces[i][:k], pieces[i][k:]) for i in merged for k in range(1, len(pieces[i]))
              if pieces[i][:k] in plain and pieces[i][k:] in plain]
    model = hf.models.BPE({p: i for i, p in enumerate(pieces)}, merges,
                          unk_token=pieces[unk], byte_fallback=True, fuse_unk=True)
  tok = hf.Tokenizer(model)
  tok.normalizer = hf.normalizers.Replace(" ", SPACE)
  tok.decoder = hf.decoders.Sequence([hf.decoders.Replace(SPACE, " "),
                                      hf.decoders.ByteFallback(), hf.decoders.Fuse()])
  tok.add_special_tokens([hf.AddedToken(pieces[i], special=True, normalized=False)
                          for i in special])
  tok.add_tokens([hf.AddedToken(pieces[i], special=False, normalized=False) for i in user])
  return tok


def _from_json(tokenizer):
  hf = _hf()
  data = json.loads(tokenizer.json_text)
  data["post_processor"] = None
  return hf.Tokenizer.from_str(json.dumps(data))


def hf_tokenizer(tokenizer, appended: Sequence[str] = ()):
  """The `tokenizers.Tokenizer` that encodes and decodes as jaxformer's `tokenizer` does, with
  the special tokens `appended` at ids vocab_size, vocab_size + 1, ... (a ValueError if a name
  is already a token)."""
  build = {"char": _char, "spm": _spm, "hf": _from_json}.get(tokenizer.kind)
  if build is None:
    raise ValueError(f"a {tokenizer.kind!r} tokenizer cannot be exported; exportable kinds: "
                     "char, spm, hf")
  tok = build(tokenizer)
  if tok.get_vocab_size(with_added_tokens=True) != tokenizer.vocab_size:
    raise ValueError(f"internal error: the exported {tokenizer.kind!r} tokenizer has "
                     f"{tok.get_vocab_size(with_added_tokens=True)} tokens, the run's "
                     f"{tokenizer.vocab_size}")
  for name in appended:
    if tok.token_to_id(name) is not None:
      raise ValueError(f"the run's tokenizer already has a token {name!r}, the name of a "
                       "special token its task adds")
  hf = _hf()
  tok.add_special_tokens([hf.AddedToken(name, special=True, normalized=False)
                          for name in appended])
  return tok


def unk_id(tokenizer) -> int | None:
  """The unknown token's id of a SentencePiece or Hugging Face tokenizer (None for char)."""
  if tokenizer.kind == "spm":
    i = tokenizer._sp.unk_id()          # pylint: disable=protected-access
    return i if i >= 0 else None
  if tokenizer.kind == "hf":
    name = (json.loads(tokenizer.json_text).get("model") or {}).get("unk_token")
    return None if name is None else _hf().Tokenizer.from_str(tokenizer.json_text).token_to_id(
        name)
  return None


def save(tokenizer, out_dir: str, *, special: Mapping[str, int | None],
         appended: Sequence[str] = (), extra_special: Sequence[str] = (),
         model_max_length: int | None = None, pair_template: tuple[int, int] | None = None
         ) -> list[str]:
  """Write tokenizer.json + tokenizer_config.json for `tokenizer` into `out_dir`.

  special: transformers' special-token attributes (`ATTRIBUTES`) -> id (None: none);
  appended: names of the ids a task adds after the vocabulary; extra_special: names of other
  special tokens (T5's sentinels); pair_template: the (cls, sep) ids that wrap text as
  `cls A sep` (and `cls A sep B sep` for pairs), as next-sentence prediction trains on.
  Returns the names of the files written."""
  hf = _hf()
  tok = hf_tokenizer(tokenizer, appended)
  names = {}
  for attribute, i in special.items():
    if attribute not in ATTRIBUTES:
      raise ValueError(f"internal error: {attribute!r} is not one of {ATTRIBUTES}")
    if i is not None:
      names[attribute] = tok.id_to_token(int(i))
      if names[attribute] is None:
        raise ValueError(f"internal error: {attribute} id {i} has no token")
  if pair_template is not None:
    (cls, cls_id), (sep, sep_id) = ((tok.id_to_token(i), i) for i in pair_template)
    tok.post_processor = hf.processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)])
  config = {"tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,        # decode gives the text back as is
            **{a: names.get(a) for a in ATTRIBUTES},
            "additional_special_tokens": list(extra_special)}
  if pair_template is not None:            # the segment ids the pair template sets
    config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
  if model_max_length is not None:
    config["model_max_length"] = int(model_max_length)
  paths.write_text(os.path.join(out_dir, TOKENIZER_JSON), tok.to_str())
  paths.write_text(os.path.join(out_dir, TOKENIZER_CONFIG),
                   json.dumps(config, indent=2, ensure_ascii=False))
  return list(FILES)
