"""A Google Cloud Storage API on localhost for the tests: `gcp-storage-emulator`, plus the
object generations it does not serve.

Why the addition: TensorStore (Orbax's OCDBT checkpoints) reads an object's generation from
the `x-goog-generation` header of a media download and updates its manifest with an
`ifGenerationMatch` precondition. The emulator sends no such header and ignores the
precondition, so every OCDBT checkpoint fails there ("Malformed StorageGeneration"), while a
real bucket serves both. The two wrappers below add exactly that, so the tests run Orbax's,
TensorStore's and gcsfs's real code against an HTTP server.

    python -m tests.gcs_emulator --port=PORT --bucket=NAME      # serves until killed
"""

from __future__ import annotations

import argparse
import functools
import http
import time

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _generation(storage, bucket: str, name: str) -> str:
  """The live generation of an object, "0" when there is none (GCS's convention)."""
  try:
    return str(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return "0"


def _with_generation_header(download):
  @functools.wraps(download)
  def wrapped(request, response, storage, *args, **kwargs):
    generation = _generation(storage, request.params["bucket_name"],
                             request.params["object_id"])
    if generation != "0":
      response["x-goog-generation"] = generation
    return download(request, response, storage, *args, **kwargs)
  return wrapped


def _with_preconditions(upload):
  @functools.wraps(upload)
  def wrapped(request, response, storage, *args, **kwargs):
    wanted = request.query.get("ifGenerationMatch", [None])[0]
    name = request.query.get("name", [None])[0]
    if wanted is not None and name is not None and (
        _generation(storage, request.params["bucket_name"], name) != wanted):
      response.status = http.HTTPStatus.PRECONDITION_FAILED
      response.json({"error": {"code": 412, "message": "Precondition Failed"}})
      return None
    return upload(request, response, storage, *args, **kwargs)
  return wrapped


def serve(port: int, bucket: str) -> None:
  objects.download = _with_generation_header(objects.download)
  objects.insert = _with_preconditions(objects.insert)
  from gcp_storage_emulator.server import create_server   # builds its routes from `objects`
  server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  server.start()
  print(f"serving gs://{bucket} on 127.0.0.1:{port}", flush=True)
  try:
    while True:
      time.sleep(3600)
  finally:
    server.stop()


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--bucket", required=True)
  args = parser.parse_args()
  serve(args.port, args.bucket)
