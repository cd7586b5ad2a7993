"""Compile MaxText's own train step for a compile-only TPU topology and save what the planner
reads: the compiled HLO text and the compiler's memory analysis (`maxtext_calibration.py`).

Runs inside a MaxText checkout's environment, not jaxformer's: it calls MaxText's AOT entry
point (`train_compile.main`, which compiles for `compile_topology=...` without a TPU) and
only wraps its `jit_and_compile` to keep the compiled object's text and memory statistics.
The exact invocation used for the committed calibration is in `maxtext_calibration.py`.

    MT_OUT=DIR python experiments/maxtext_compile.py src/maxtext/configs/base.yml KEY=VALUE...
"""

import json
import os
import sys
import time


def main():
  out_dir = os.environ.get("MT_OUT", "maxtext_compile_out")
  os.makedirs(out_dir, exist_ok=True)
  from absl import app
  from maxtext.trainers.pre_train import train_compile   # MaxText's own AOT compile

  original = train_compile.jit_and_compile

  def keep(*args, **kwargs):
    start = time.time()
    compiled = original(*args, **kwargs)
    with open(os.path.join(out_dir, "train_step.hlo.txt"), "w") as f:
      f.write(compiled.as_text())
    stats = compiled.memory_analysis()
    memory = {n: getattr(stats, n) for n in dir(stats) if n.endswith("_in_bytes")}
    with open(os.path.join(out_dir, "analysis.json"), "w") as f:
      json.dump({"compile_seconds": round(time.time() - start), "memory": memory,
                 "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", ""),
                 "argv": sys.argv}, f, indent=1)
    return compiled

  train_compile.jit_and_compile = keep
  app.run(train_compile.main)


if __name__ == "__main__":
  main()
