"""gcp-storage-emulator (in memory, one bucket) for tests/test_storage.py:

  python tests/gcs_emulator.py PORT BUCKET

with one addition that real GCS makes and the emulator does not: every object download
carries the object's generation (`x-goog-generation`, `x-goog-metageneration` headers).
tensorstore, orbax's array store, reads an object's generation from them to make its
conditional writes (OCDBT manifests), and fails with "Malformed StorageGeneration" without.
Conditional requests themselves (ifGenerationMatch) are not enforced by the emulator, which
a single writer does not need. And a listen backlog that takes a burst of parallel
connections (the token cache's ranged reads open many).
"""
import socketserver
import sys
import threading

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
  except NotFound:
    return
  response["x-goog-generation"] = str(obj["generation"])
  response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))


objects.download = download
# A listen backlog of 5 (socketserver's default) drops the SYNs of a burst of parallel
# connections, which the client retries after a second: real GCS has no such limit.
socketserver.TCPServer.request_queue_size = 256
from gcp_storage_emulator.server import create_server  # noqa: E402  (binds the handler above)


def main(port: int, bucket: str):
  server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  server.start()
  print(f"GCS emulator on 127.0.0.1:{port}, bucket {bucket}", flush=True)
  threading.Event().wait()


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])
