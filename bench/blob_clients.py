"""boto3 against obstore on moto's S3 server: which client the S3 blob store uses.

Puts and gets one large blob (multipart) and many small ones, as artifacts are: a
payload of tens of MB and a few hundred kernel binaries of some KB. Both clients talk
to the same moto_server process on loopback, so the figures compare the clients'
overheads, not a network; they are a guide for the choice, not a claim about AWS.

    .venv/bin/python bench/blob_clients.py [--large-mb 64] [--small 200] [--small-kb 64]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from localfarm.s3 import CREDENTIALS, make_bucket, start_moto_server  # noqa: E402
from localfarm.stack import free_port  # noqa: E402


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_boto3(endpoint: str, large: bytes, small: list[bytes]) -> dict[str, float]:
    from boto3.s3.transfer import TransferConfig

    from torchfarm.storage.blobs import s3_client

    s3 = s3_client(endpoint)
    import io

    cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20)
    return {
        "large put": timed(lambda: s3.upload_fileobj(io.BytesIO(large), "bench-boto3", "large", Config=cfg)),
        "large get": timed(lambda: s3.get_object(Bucket="bench-boto3", Key="large")["Body"].read()),
        "small put": timed(lambda: [s3.put_object(Bucket="bench-boto3", Key=f"s{i}", Body=b) for i, b in enumerate(small)]),
        "small get": timed(lambda: [s3.get_object(Bucket="bench-boto3", Key=f"s{i}")["Body"].read() for i in range(len(small))]),
    }


def run_obstore(endpoint: str, large: bytes, small: list[bytes]) -> dict[str, float]:
    import obstore
    from obstore.store import S3Store

    store = S3Store("bench-obstore", endpoint=endpoint, region="us-east-1", client_options={"allow_http": True},
                    access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], virtual_hosted_style_request=False)
    return {
        "large put": timed(lambda: obstore.put(store, "large", large, chunk_size=16 << 20)),
        "large get": timed(lambda: bytes(obstore.get(store, "large").bytes())),
        "small put": timed(lambda: [obstore.put(store, f"s{i}", b) for i, b in enumerate(small)]),
        "small get": timed(lambda: [bytes(obstore.get(store, f"s{i}").bytes()) for i in range(len(small))]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--large-mb", type=int, default=64)
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--small-kb", type=int, default=64)
    args = ap.parse_args()
    os.environ.update(CREDENTIALS)
    port = free_port()
    proc = start_moto_server(port, Path(tempfile.mkdtemp()) / "moto.log")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for bucket in ("bench-boto3", "bench-obstore"):
            make_bucket(endpoint, bucket)
        large = os.urandom(args.large_mb << 20)
        small = [os.urandom(args.small_kb << 10) for _ in range(args.small)]
        results = {"boto3": run_boto3(endpoint, large, small), "obstore": run_obstore(endpoint, large, small)}
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"{'seconds':<10} {'boto3':>8} {'obstore':>8}   ({args.large_mb} MB large, "
          f"{args.small} x {args.small_kb} KB small)")
    for op in results["boto3"]:
        print(f"{op:<10} {results['boto3'][op]:>8.2f} {results['obstore'][op]:>8.2f}")


if __name__ == "__main__":
    main()
