"""jaxformer: attention and Transformers in JAX/Flax, from a laptop CPU to a TPU pod."""

import glob as _glob
import os as _os

__version__ = "0.1.0"

# Set by `_quiet_libtpu` below: the TPU type is ours, so `plan.topology` may replace it with the
# generation it compiles for.
LIBTPU_QUIETED = "JAXFORMER_LIBTPU_QUIETED"


def real_tpu_attached() -> bool:
  """A TPU VM's chips are /dev/accel* (v4, v5e) or /dev/vfio/N (v5p, v6e)."""
  return bool(_glob.glob("/dev/accel*") or _glob.glob("/dev/vfio/[0-9]*"))


def _quiet_libtpu() -> None:
  """With libtpu installed (the [tpu] and [test] extras) and no TPU attached, JAX's look for a
  TPU made libtpu print a warning and five `E0000 ... unexpected worker hostname` lines on
  every command that touched JAX. libtpu reads these two variables on a TPU VM; giving them
  placeholders (only where no TPU chip is attached and the user set neither) silences it,
  and JAX falls back to the CPU or GPU as before."""
  if real_tpu_attached():
    return
  if "TPU_ACCELERATOR_TYPE" not in _os.environ:
    _os.environ["TPU_ACCELERATOR_TYPE"] = "v5litepod-4"
    _os.environ[LIBTPU_QUIETED] = "1"
  _os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


_quiet_libtpu()
