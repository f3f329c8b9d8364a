"""TLS for the coordinator's off-node listener: a certificate made at start for this run only.

With more than one node, workers on the other nodes talk to the coordinator over the
allocation's network. That traffic is encrypted with TLS and authenticated twice: the client
pins the server's certificate, the server checks the client's bearer token.

* The certificate is made when the coordinator starts: a fresh EC P-256 key, self-signed,
  naming the bound address, valid for :data:`CERTIFICATE_DAYS`. No CA is involved: the
  SHA-256 fingerprint of the certificate is published with the endpoint and token (the 0600
  endpoint document), and clients accept exactly that certificate (:func:`certificate_matches`),
  so a process that took over the address gets no token.
* It is made with ``openssl req``: the OpenSSL command is on every node and in every image
  already (Debian's ca-certificates depends on it; container/*.def check it), so TLS adds no
  dependency; Python's ``ssl`` module cannot make certificates. It costs ~10 ms at start.
* The private key exists on disk only while ``openssl`` writes it and ``ssl`` loads it: in a
  0700 temporary directory inside the coordinator's private 0700 scratch, removed right after.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

from .errors import AllocstackError

#: How long a run's certificate is valid: longer than any allocation, shorter than a key should live.
CERTIFICATE_DAYS = 30


def certificate_command(address: str, common_name: str, key: Path, certificate: Path,
                        days: int = CERTIFICATE_DAYS) -> list[str]:
    """``openssl req`` making a new P-256 key and a self-signed, non-CA certificate for ``address``."""
    return ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(key), "-out", str(certificate), "-days", str(days), "-subj", f"/CN={common_name}",
            "-addext", f"subjectAltName=IP:{address}", "-addext", "basicConstraints=critical,CA:FALSE"]


def fingerprint(certificate_pem: str) -> str:
    """SHA-256 of the certificate's DER encoding, as hex: what clients pin."""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(certificate_pem)).hexdigest()


def certificate_matches(certificate_der: bytes | None, pinned: str) -> bool:
    """True when the DER certificate a server presented has SHA-256 ``pinned`` (hex, see :func:`fingerprint`)."""
    return hmac.compare_digest(hashlib.sha256(certificate_der or b"").hexdigest(), pinned)


def client_context() -> ssl.SSLContext:
    """A TLS client context without CA verification: the caller pins the run's certificate by its
    fingerprint (``httpclient.HttpConnection``, ``sessions.PinnedAdapter``, ``tunnel.pinned_connection``), which is
    the verification."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def tls_context(address: str, common_name: str, private_dir: Path) -> tuple[ssl.SSLContext, str]:
    """A TLS server context with a new certificate for ``address``, and the fingerprint clients pin.

    :raises AllocstackError: ``prerequisite`` when openssl is missing or fails, or ``private_dir``
        cannot hold the transient key.
    """
    if shutil.which("openssl") is None:
        raise AllocstackError("prerequisite", "TLS between nodes needs the openssl command (Debian: the openssl "
                                              "package), or config network.tls: false where your center allows it")
    try:
        work = tempfile.TemporaryDirectory(prefix=".tls-", dir=private_dir)  # 0700
    except OSError as exc:
        raise AllocstackError("prerequisite", f"cannot write the run's TLS key in {private_dir}: {exc.strerror}") from exc
    with work as directory:
        key, certificate = Path(directory) / "key.pem", Path(directory) / "certificate.pem"
        try:
            done = subprocess.run(certificate_command(address, common_name, key, certificate),
                                  capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AllocstackError("prerequisite", f"openssl could not make the run's certificate: {exc}") from exc
        if done.returncode != 0:
            raise AllocstackError("prerequisite", f"openssl could not make the run's certificate: "
                                                  f"{done.stderr.strip()[-300:]}")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certificate, key)
        return context, fingerprint(certificate.read_text())
