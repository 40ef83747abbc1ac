"""An S3 endpoint on loopback for tests and benchmarks: moto's server, in a process.

No S3 server ships as a Debian package; `moto_server` speaks S3's HTTP protocol, so
the blob store's code runs against it unchanged, as it would against AWS S3 or MinIO.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""moto accepts any credentials; boto3 refuses to sign without some."""


def start_moto_server(port: int, log_path: Path | None = None, timeout_s: float = 30.0) -> subprocess.Popen:
    """moto_server on 127.0.0.1:`port`, answering HTTP on return."""
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    if not Path(exe).exists():
        raise FileNotFoundError("moto_server is not installed (pip install 'moto[server]')")
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start on port {port}") from None
            time.sleep(0.1)


def make_bucket(endpoint: str, bucket: str) -> None:
    from torchfarm.storage.blobs import s3_client

    client = s3_client(endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
