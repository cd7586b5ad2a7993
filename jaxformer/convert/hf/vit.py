"""family='vit' (pool='cls') <-> ViTForImageClassification, ViTModel.

transformers' models/vit/modeling_vit.py: pre-norm encoder layers of torch Linears; the patch
conv [E, C, ph, pw] becomes [ph, pw, C, E] and the position embeddings [1, N+1, E] become
[N+1, E]. ViTModel's pooler is dropped with a warning and its missing classifier is zeros.
"""

from __future__ import annotations


from jaxformer.convert.hf import core
from jaxformer.convert.hf.core import Rule

ARCHITECTURES = {"ViTForImageClassification": "vit", "ViTModel": "vit"}
MODEL_TYPES = {"vit": "ViTForImageClassification"}
PREFIXES = {"vit": "vit."}
RENAMES = ()
STACK = "encoder"
# Block settings Hugging Face's ViT has no option for (see core.FIXED).
FIXED = dict(num_kv_heads=None, head_dim=None, window=None, use_bias=True, qkv_bias=True,
             ffn="mlp", norm="layernorm", pre_norm=True, num_experts=0)
KEEP = ()

# torch conv [E, C, ph, pw] -> flax [ph, pw, C, E]
_CONV2D = dict(to_ours=lambda s, w: w.transpose(2, 3, 1, 0),
               to_hf=lambda k: (k.transpose(3, 2, 0, 1),))
_ADD_BATCH = dict(to_ours=lambda s, w: w.reshape(s), to_hf=lambda k: (k[None],))


def unused(name: str, tensors: dict, config: dict) -> str | None:
  if name.startswith("vit.pooler."):
    return "jaxformer's ViT has no pooler; its head reads the final-norm [CLS] token"
  return None


def rules(kind: str, c: dict, flags: dict) -> list[Rule]:
  e, f, p_ = c["d_model"], c["mlp_dim"], c["patch_size"]
  n = (c["image_size"] // p_) ** 2 + 1
  emb = "vit.embeddings"
  rules = [Rule("cls", (1, 1, e), (f"{emb}.cls_token",), **core.SAME),
           Rule("pos_embed/embedding", (n, e), (f"{emb}.position_embeddings",), **_ADD_BATCH),
           Rule("patch_embed/proj/kernel", (p_, p_, c["channels"], e),
                (f"{emb}.patch_embeddings.projection.weight",), **_CONV2D),
           Rule("patch_embed/proj/bias", (e,), (f"{emb}.patch_embeddings.projection.bias",),
                **core.SAME)]
  for i in range(c["num_layers"]):
    p, t = f"encoder/layers_{i}/block", f"vit.encoder.layer.{i}"
    attention, wi, wo = core.encoder_layer_rules(p, t, "attention.attention", e=e,
                                                 h=c["num_heads"], f=f,
                                                 qkv_bias=flags["qkv_bias"])
    rules += core.norm_rules(f"{p}/self_attention_norm", f"{t}.layernorm_before", e)
    rules += attention
    rules += core.norm_rules(f"{p}/ffn_norm", f"{t}.layernorm_after", e)
    rules += wi + wo
  rules += core.norm_rules("final_norm", "vit.layernorm", e)
  rules += core.linear_rules("head", "classifier", e, c["num_classes"],
                             hf_has=flags["classifier"])
  return rules


def from_hf(arch: str, kind: str, hc: dict, tensors) -> tuple[dict, dict]:
  image, patch = hc.get("image_size", 224), hc.get("patch_size", 16)
  for key, value in (("image_size", image), ("patch_size", patch)):
    if isinstance(value, (list, tuple)):
      if len(value) != 2 or value[0] != value[1]:
        core.unsupported(arch, key, value, " (only square images and patches)")
  image = image[0] if isinstance(image, (list, tuple)) else image
  patch = patch[0] if isinstance(patch, (list, tuple)) else patch
  e, h = core.width_and_heads(arch, hc, "hidden_size", "num_attention_heads")
  labels = hc.get("id2label")
  num_classes = len(labels) if labels else hc.get("num_labels", 2)
  cfg = dict(num_classes=num_classes, patch_size=patch, image_size=image, d_model=e,
             num_layers=hc.get("num_hidden_layers", 12), num_heads=h,
             mlp_dim=hc.get("intermediate_size", 3072), channels=hc.get("num_channels", 3),
             pool="cls", norm_eps=float(hc.get("layer_norm_eps", 1e-12)),
             activation=core.act_from_hf(hc.get("hidden_act", "gelu"), "hidden_act"),
             dropout_rate=float(hc.get("hidden_dropout_prob", 0.0)),
             attention_dropout_rate=float(hc.get("attention_probs_dropout_prob", 0.0)))
  return cfg, dict(qkv_bias=bool(hc.get("qkv_bias", True)),
                   classifier=arch == "ViTForImageClassification")


def to_hf(c: dict) -> tuple[str, dict, dict]:
  if c.get("pool", "cls") != "cls":
    raise ValueError(f"model.pool={c.get('pool')!r}: Hugging Face ViT classifies the [CLS] "
                     "token; only pool='cls' can be saved")
  k = c["num_classes"]
  hc = dict(architectures=["ViTForImageClassification"], model_type="vit",
            hidden_size=c["d_model"], num_hidden_layers=c["num_layers"],
            num_attention_heads=c["num_heads"], intermediate_size=c["mlp_dim"],
            hidden_act=core.act_to_hf(c.get("activation", "gelu_exact")),
            layer_norm_eps=c.get("norm_eps", 1e-6), image_size=c["image_size"],
            patch_size=c["patch_size"], num_channels=c.get("channels", 3), qkv_bias=True,
            hidden_dropout_prob=c.get("dropout_rate", 0.0),
            attention_probs_dropout_prob=c.get("attention_dropout_rate", 0.0),
            id2label={str(i): f"LABEL_{i}" for i in range(k)},
            label2id={f"LABEL_{i}": i for i in range(k)}, torch_dtype="float32",
            dtype="float32")
  return "ViTForImageClassification", hc, dict(qkv_bias=True, classifier=True)
