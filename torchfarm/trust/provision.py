"""A deployment's secrets, made once: what docker-compose.yml's `init` service runs.

    python -m torchfarm.trust.provision /secrets

Each reader gets a directory of its own (compose mounts each as its own volume, so a
worker never sees the coordinator's TLS key and Redis never sees a token):

- `coordinator/`: tls.crt, tls.key (a server certificate for `--hosts`), tokens.json,
  trusted-keys.json (it recompiles artifacts no pinned key signed), broker-url, cache-url,
  state-url;
- `worker/`: signing-key.pem, broker-url, cache-url, state-url;
- `redis/`: broker.acl, cache.acl, state.acl (one user per role, each with its own
  password; the state Redis's passwords are its own, so a cache URL that leaks opens
  no job in flight; the unauthenticated user may only PING, for health checks);
- `client/`: ca.crt, trusted-keys.json, token: everything a client on another machine
  needs (docs/operations.md says how to copy it out);
- `grafana/`: admin-password (Grafana reads it through GF_SECURITY_ADMIN_PASSWORD__FILE);
- `ca/`: the CA's key, kept to issue certificates for more host names later.

Idempotent: a file that exists is kept, so rerunning `init` (or `up` after `down`) never
rotates a key that clients pinned. Delete a file to make it anew. Torch-free.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import logging
import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from torchfarm.trust import tokens
from torchfarm.trust.signing import Signer

log = logging.getLogger(__name__)

ROLES = ("coordinator", "worker")
"""Redis users, one per kind of process; each gets its own password."""
SERVICE_UID = 10001
"""The uid the project's images run as (docker/*.Dockerfile)."""
CERT_DAYS = 825
"""Validity of the server certificate; the CA's is ten years."""


def provision(out: Path, *, tenant: str, hosts: Sequence[str], broker: str, cache: str,
              state: str = "redis-state:6379", owner: int | None = None) -> dict[str, Path]:
    """Makes what is missing under `out`; returns the client's files by name."""
    dirs = {name: out / name for name in ("ca", "coordinator", "worker", "redis", "client", "grafana")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    _signing(dirs)
    _token(dirs, tenant)
    _tls(dirs, hosts)
    _redis(dirs, broker, cache, state)
    password(dirs["grafana"] / "admin-password")
    if owner is not None:
        _chown(out, owner, skip=dirs["redis"])
    client = {p.name: p for p in sorted(dirs["client"].iterdir())}
    log.info("torchfarm provision: client files in %s: %s", dirs["client"], ", ".join(client))
    return client


def _write(path: Path, data: bytes | str, mode: int) -> bool:
    """Writes `path` unless it exists (never truncates a key someone pinned)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return True


def _signing(dirs: dict[str, Path]) -> None:
    key = dirs["worker"] / "signing-key.pem"
    if not key.exists():
        Signer.generate().save(key)
    pins = json.dumps(Signer.from_file(key).trusted_entry(), indent=2) + "\n"
    for reader in ("coordinator", "client"):
        _write(dirs[reader] / "trusted-keys.json", pins, 0o644)


def _token(dirs: dict[str, Path], tenant: str) -> None:
    token_file = dirs["client"] / "token"
    if _write(token_file, tokens.new_token(tenant) + "\n", 0o600) or not (dirs["coordinator"] / "tokens.json").exists():
        token = token_file.read_text().strip()
        table_file = dirs["coordinator"] / "tokens.json"
        table = json.loads(table_file.read_text()) if table_file.exists() else {}
        table.update(tokens.table_entry(token, tenant))
        table_file.write_text(json.dumps(table, indent=2) + "\n")
        table_file.chmod(0o600)


def _tls(dirs: dict[str, Path], hosts: Sequence[str]) -> None:
    ca_key_file, ca_cert_file = dirs["ca"] / "ca.key", dirs["client"] / "ca.crt"
    if not ca_key_file.exists():
        ca_key = ec.generate_private_key(ec.SECP256R1())
        _write(ca_key_file, _pem_key(ca_key), 0o600)
        ca_cert_file.unlink(missing_ok=True)
    # This module writes only EC keys; the loader's type is every private key.
    ca_key = cast(ec.EllipticCurvePrivateKey,
                  serialization.load_pem_private_key(ca_key_file.read_bytes(), None))
    if not ca_cert_file.exists():
        _write(ca_cert_file, _ca_cert(ca_key).public_bytes(serialization.Encoding.PEM), 0o644)
        (dirs["coordinator"] / "tls.crt").unlink(missing_ok=True)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_file.read_bytes())
    if not (dirs["coordinator"] / "tls.crt").exists():
        key = ec.generate_private_key(ec.SECP256R1())
        (dirs["coordinator"] / "tls.key").unlink(missing_ok=True)
        _write(dirs["coordinator"] / "tls.key", _pem_key(key), 0o600)
        cert = _server_cert(key, ca_key, ca_cert, hosts)
        _write(dirs["coordinator"] / "tls.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name | None, days: int,
             public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def _ca_cert(ca_key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    b = _builder("torchfarm deployment CA", None, 3650, ca_key.public_key())
    b = b.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    b = b.add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                      key_encipherment=False, data_encipherment=False,
                                      key_agreement=False, key_cert_sign=True, crl_sign=True,
                                      encipher_only=False, decipher_only=False), critical=True)
    return b.sign(ca_key, hashes.SHA256())


def _server_cert(key: ec.EllipticCurvePrivateKey, ca_key: ec.EllipticCurvePrivateKey,
                 ca_cert: x509.Certificate, hosts: Sequence[str]) -> x509.Certificate:
    if not hosts:
        raise ValueError("the server certificate needs at least one host name (--hosts)")
    b = _builder(hosts[0], ca_cert.subject, CERT_DAYS, key.public_key())
    b = b.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
    b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return b.sign(ca_key, hashes.SHA256())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _redis(dirs: dict[str, Path], broker: str, cache: str, state: str) -> None:
    shared = {role: password(dirs["redis"] / f"{role}.password") for role in ROLES}
    own = {role: password(dirs["redis"] / f"state-{role}.password") for role in ROLES}
    for instance, address, db in (("broker", broker, 0), ("cache", cache, 0), ("state", state, 0)):
        passwords = own if instance == "state" else shared
        _write(dirs["redis"] / f"{instance}.acl", redis_acl(passwords), 0o644)
        for role in ROLES:
            _write(dirs[role] / f"{instance}-url", redis_url(role, passwords[role], address, db) + "\n", 0o600)


# What no role runs and a leaked password must not: the server's administration (CONFIG,
# SHUTDOWN, REPLICAOF, MODULE, SAVE, ACL, DEBUG, CLIENT KILL, MONITOR...) and wiping or
# swapping whole databases. Replicating from a stranger's host and loading a module from
# the file it sent is how a Redis password becomes code on the Redis host.
SERVER_COMMANDS = "-@admin -flushall -flushdb -swapdb"


def redis_acl(passwords: Mapping[str, str], channels: bool = True) -> str:
    """A Redis ACL file: one user per name, with its password, allowed every key and
    every command but `SERVER_COMMANDS`. The unauthenticated default user may PING only:
    health checks need no password. `channels=False` leaves out the pub/sub channels rule
    (`&*`), which Redis reads from 6.2 on and 6.0 refuses (channels are all allowed there
    anyway)."""
    rules = f"~* &* +@all {SERVER_COMMANDS}" if channels else f"~* +@all {SERVER_COMMANDS}"
    return "user default on nopass -@all +ping\n" + "".join(
        f"user {user} on >{pw} {rules}\n" for user, pw in passwords.items()
    )


def redis_url(user: str, pw: str, address: str, db: int) -> str:
    """The URL of `redis_acl`'s `user` at "host:port", database `db`."""
    return f"redis://{user}:{pw}@{address}/{db}"


def password(path: Path) -> str:
    """The random password kept in `path` (mode 0600), made the first time."""
    _write(path, secrets.token_urlsafe(24), 0o600)
    return path.read_text().strip()


def _chown(out: Path, uid: int, skip: Path) -> None:
    # Run as root in the init container; the services read their files as SERVICE_UID.
    # Redis' own files stay root-owned and world-readable: its image's uid differs by
    # distribution, and that volume is mounted into the Redis containers only. Grafana's
    # image runs as uid 472: its one file is made readable the same way.
    for path in [out, *out.rglob("*")]:
        if path != skip and skip not in path.parents:
            os.chown(path, uid, uid)
    (out / "grafana" / "admin-password").chmod(0o644)


def main(argv: Sequence[str] | None = None, env: dict[str, str] | None = None,
         run: Callable[..., dict[str, Path]] = provision) -> int:
    env = dict(os.environ) if env is None else env
    ap = argparse.ArgumentParser(prog="python -m torchfarm.trust.provision", description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tenant", default=env.get("TORCHFARM_PROVISION_TENANT", "default"))
    ap.add_argument("--hosts", default=env.get("TORCHFARM_PROVISION_HOSTS", "coordinator,localhost,127.0.0.1"),
                    help="comma-separated names and IPs clients reach the coordinator by")
    ap.add_argument("--broker", default=env.get("TORCHFARM_PROVISION_BROKER", "redis-broker:6379"))
    ap.add_argument("--cache", default=env.get("TORCHFARM_PROVISION_CACHE", "redis-cache:6379"))
    ap.add_argument("--state", default=env.get("TORCHFARM_PROVISION_STATE", "redis-state:6379"))
    ap.add_argument("--owner", type=int, default=SERVICE_UID if os.geteuid() == 0 else None,
                    help=f"uid that owns the files (default: {SERVICE_UID} when run as root)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    client = run(args.out, tenant=args.tenant, hosts=hosts, broker=args.broker, cache=args.cache,
                 state=args.state, owner=args.owner)
    print(f"torchfarm provision: done; clients need {', '.join(sorted(client))} from {args.out / 'client'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
