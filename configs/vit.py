"""Vision Transformer (Dosovitskiy et al., 2021):
`--config=configs/vit.py:{Ti/16,S/16,B/16,B/32,L/16,L/32,H/14,tiny}`.

Pre-norm encoder on 224x224 RGB images cut into patches, a [CLS] token (pool 'cls'),
learned positions, exact GELU, LayerNorm eps 1e-6, linear head to 1000 classes.
Ti and S are the DeiT sizes (Touvron et al., 2021). Counts are compared with
`scaling.count_params(...)['backbone']` (no classification head):
`reference.params_exact` is timm's `vit_base_patch16_224` with num_classes=0 (B/16 only);
`reference.params` is the paper's Table 1 (rounded: 86M B, 307M L, 632M H; DeiT's 5M Ti,
22M S; none for the /32 variants).

Training: the paper's ImageNet-1k-from-scratch setting (Adam b1 0.9, b2 0.999, batch 4096,
weight decay 0.3 (decoupled: 0.3 * lr in big_vision's convention), 10k warmup steps, clip
1.0; 300 epochs = ~93k steps; cosine decay (the paper uses linear; big_vision uses cosine).

`tiny`: 8x8 grey-scale digits (source 'digits': sklearn's `load_digits`, 10 classes, no
download), patch 2 (16 patches + [CLS]), d_model 64, 2 layers: for CPU tests and demos.
"""

from configs import common

# name: (patch, d_model, num_layers, num_heads, mlp_dim, paper params, exact backbone count)
SIZES = {
    "Ti/16": (16, 192, 12, 3, 768, 5e6, None),
    "S/16": (16, 384, 12, 6, 1536, 22e6, None),
    "B/16": (16, 768, 12, 12, 3072, 86e6, 85_798_656),
    "B/32": (32, 768, 12, 12, 3072, None, None),
    "L/16": (16, 1024, 24, 16, 4096, 307e6, None),
    "L/32": (32, 1024, 24, 16, 4096, None, None),
    "H/14": (14, 1280, 32, 16, 5120, 632e6, None),
    "tiny": (2, 64, 2, 4, 128, None, None),
}


def get_config(arg=None):
  name, (patch, d_model, num_layers, num_heads, mlp_dim, params, exact) = common.select(
      "vit", arg, SIZES)
  tiny = name == "tiny"
  model = common.model(
      "vit", f"vit-{name}", num_classes=10 if tiny else 1000, patch_size=patch,
      image_size=8 if tiny else 224, channels=1 if tiny else 3, d_model=d_model,
      num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim, pool="cls",
      norm_eps=1e-6, activation="gelu_exact", dropout_rate=0.0,
      dtype="float32" if tiny else "bfloat16")
  if tiny:
    return common.config(
        model=model, data=common.data("digits", None, None, image_size=8),
        train=common.train(1000, 64, eval_every=100, log_every=20, checkpoint_every=500),
        optim=common.optim(1e-3, warmup_steps=50, weight_decay=1e-4, b2=0.999))
  return common.config(
      model=model,
      data=common.data("tfds:imagenet2012", None, None, image_size=224),
      train=common.train(93_000, 4096, eval_every=1000, log_every=50, checkpoint_every=2000),
      optim=common.optim(3e-3, warmup_steps=10_000, weight_decay=0.3, b2=0.999),
      reference=common.reference(
          None if params is None else round(params), params_key="backbone",
          source="Dosovitskiy et al. 2021, Table 1 (Ti/S: Touvron et al. 2021), rounded",
          params_exact=exact,
          params_exact_source="timm vit_base_patch16_224, num_classes=0" if exact else ""))
