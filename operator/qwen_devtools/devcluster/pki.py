"""Throw-away PKI for the dev cluster, made with ``cryptography`` (ECDSA P-256, fast to generate).

Files written into the given directory:

* ``ca.crt``/``ca.key``: cluster CA; signs the apiserver serving certificate.
* ``apiserver.crt``/``apiserver.key``: serving certificate for 127.0.0.1, localhost and the in-cluster names.
* ``front-proxy-ca.crt``, ``front-proxy-client.crt``/``.key``: lets the aggregator authenticate to an
  aggregated API server (e.g. a custom metrics API) through the request-header flags.
* ``apiserver-kubelet-client.crt``/``.key`` (with a real node only): the apiserver's client certificate
  for kubelet (logs, exec, port-forward), in ``system:masters`` so kubelet's webhook authorizer admits it.
* ``kubelet.crt``/``.key``, ``kube-proxy.crt``/``.key`` (with a real node only): the node's own client
  certificates (see `generate`).
* ``sa.key``/``sa.pub``: service account token signing key pair.
* ``tokens.csv``: static bearer token of the ``admin`` user in ``system:masters``.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_CLUSTER_IP = "10.96.0.1"
API_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
FRONT_PROXY_CLIENT_CN = "front-proxy-client"
KUBELET_CLIENT_CN = "kube-apiserver-kubelet-client"
#: The user Kubernetes' default ClusterRoleBinding system:node-proxier binds.
KUBE_PROXY_CN = "system:kube-proxy"
_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files and the admin bearer token."""

    dir: Path
    admin_token: str

    def path(self, name: str) -> str:
        """Absolute path of one PKI file, as a string for command lines."""
        return str(self.dir / name)


def _name(cn: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _self_signed_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new CA: its self-signed certificate (signs certificates and CRLs) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(common_name)
    cert = (
        _builder(subject, subject, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_ca(directory: Path, stem: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert, key = _self_signed_ca(f"qwen-devcluster-{stem}")
    _write_cert(directory / f"{stem}.crt", cert)
    _write_key(directory / f"{stem}.key", key)
    return cert, key


def _make_leaf(
    directory: Path,
    stem: str,
    cn: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
    organization: str | None = None,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(_name(cn, organization), ca[0].subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write_cert(directory / f"{stem}.crt", builder.sign(ca[1], hashes.SHA256()))
    _write_key(directory / f"{stem}.key", key)


def _serving_sans(extra_ips: list[str]) -> list[x509.GeneralName]:
    ips = ["127.0.0.1", SERVICE_CLUSTER_IP, *extra_ips]
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
    return names + [x509.DNSName(dns) for dns in API_DNS_NAMES]


def _make_sa_keys(directory: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    _write_key(directory / "sa.key", key)
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (directory / "sa.pub").write_bytes(pub)


def generate(directory: Path, extra_ips: list[str], node: str | None = None) -> Pki:
    """Create every PKI file in ``directory``; ``extra_ips`` are added to the serving certificate.

    ``node`` (the real node's name) adds the apiserver's client certificate for its kubelet, and the
    node's own client certificates: ``kubelet`` as ``system:node:<node>`` in ``system:nodes`` (what the
    Node authorizer and NodeRestriction confine) and ``kube-proxy`` as ``system:kube-proxy`` (bound to
    the ``system:node-proxier`` ClusterRole by Kubernetes' default RBAC).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(directory, "ca")
    _make_leaf(
        directory,
        "apiserver",
        "kube-apiserver",
        ca,
        ExtendedKeyUsageOID.SERVER_AUTH,
        _serving_sans(extra_ips),
    )
    if node:
        _make_leaf(
            directory,
            "apiserver-kubelet-client",
            KUBELET_CLIENT_CN,
            ca,
            ExtendedKeyUsageOID.CLIENT_AUTH,
            organization="system:masters",
        )
        _make_leaf(
            directory, "kubelet", f"system:node:{node}", ca, ExtendedKeyUsageOID.CLIENT_AUTH,
            organization="system:nodes",
        )  # fmt: skip
        _make_leaf(directory, "kube-proxy", KUBE_PROXY_CN, ca, ExtendedKeyUsageOID.CLIENT_AUTH)
    front_proxy_ca = _make_ca(directory, "front-proxy-ca")
    _make_leaf(
        directory,
        "front-proxy-client",
        FRONT_PROXY_CLIENT_CN,
        front_proxy_ca,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _make_sa_keys(directory)
    token = secrets.token_hex(24)
    tokens = directory / "tokens.csv"
    tokens.write_text(f'{token},admin,admin-uid,"system:masters"\n')
    tokens.chmod(0o600)
    return Pki(directory, token)


def load(directory: Path) -> Pki:
    """The PKI previously generated in ``directory``."""
    token = (directory / "tokens.csv").read_text().split(",", 1)[0]
    return Pki(directory, token)


def service_tls(ca_name: str, dns_names: list[str]) -> dict[str, bytes]:
    """A throw-away CA and one certificate for in-cluster Services ``dns_names`` (the first its common
    name), usable both to serve and as a client (mutual TLS between two components), in memory as the
    keys of a kubernetes.io/tls Secret plus ``ca.crt``."""
    ca, ca_key = _self_signed_ca(ca_name)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        _builder(_name(dns_names[0]), ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return {
        "ca.crt": ca.public_bytes(pem),
        "tls.crt": cert.public_bytes(pem),
        "tls.key": key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    }
