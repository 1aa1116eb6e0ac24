"""TLS: a gateway listener's filter chains by server name, its SDS files, upstream TLS. Pure.

A gateway with ``tls`` gets, per certificate, a filter chain matched on the client's SNI
(``server_names``), and a default chain (the certificate without ``sni``, else the first one)
for clients naming none of them. Each chain's certificate comes by file-based SDS: the listener
names a secret and the SDS file that holds it (``sds_dir/<secret>.yaml``, watched); the secret
names the certificate and key files, and Envoy watches their directory and reloads both when
a file is moved into it, so renewing a certificate drops no connection. TLS 1.2 at least,
ALPN ``h2`` and ``http/1.1``. A client speaking plain HTTP to the port matches a last chain
(``transport_protocol: raw_buffer``) answering ``400`` with a JSON error saying to use https.

mTLS (``client_certificates``): the client certificate is verified against the CA, and the
connection manager replaces any client-sent ``x-forwarded-client-cert`` by the verified
certificate's subject, URI and DNS SANs (``SANITIZE_SET``), which the identity plugin reads.
Without mTLS the header is stripped (``SANITIZE``).
"""

from __future__ import annotations

import json
import os
import re

from envoy.config.core.v3 import base_pb2, config_source_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from controlplane.translate.protos import any_of
from policy.tls import GatewayTls, UpstreamTls

__all__ = [
    "PLAINTEXT_REFUSAL",
    "SECRET_TYPE",
    "chain_matches",
    "client_cert_forwarding",
    "downstream_transport_socket",
    "sds_documents",
    "secret_name",
    "tls_inspector",
    "upstream_transport_socket",
]

SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
PLAINTEXT_REFUSAL = "this port speaks TLS: use https://"
_TLS_SOCKET = "envoy.transport_sockets.tls"
_VERSIONS = {
    "TLSv1_2": common_pb2.TlsParameters.TLSv1_2,
    "TLSv1_3": common_pb2.TlsParameters.TLSv1_3,
}


def secret_name(node: str, index: int) -> str:
    return f"tokenweir-tls-{re.sub(r'[^A-Za-z0-9_.-]', '_', node)}-{index}"


def _sds_path(tls: GatewayTls, name: str) -> str:
    return os.path.join(tls.sds_dir, f"{name}.yaml")


def sds_documents(node: str, tls: GatewayTls) -> dict[str, str]:
    """SDS file path → its content (JSON, which Envoy reads as YAML), one per certificate."""
    docs = {}
    for i, c in enumerate(tls.certificates):
        name = secret_name(node, i)
        secret = {
            "@type": SECRET_TYPE,
            "name": name,
            "tls_certificate": {
                "certificate_chain": {"filename": c.cert},
                "private_key": {"filename": c.key},
                "watched_directory": {"path": os.path.dirname(c.cert)},
            },
        }
        docs[_sds_path(tls, name)] = json.dumps({"resources": [secret]}, indent=1) + "\n"
    return docs


def chain_matches(tls: GatewayTls) -> list[tuple[int, tuple[str, ...]]]:
    """(certificate index, server names) of each TLS filter chain; ``()`` is the default."""
    chains = [(i, c.sni) for i, c in enumerate(tls.certificates) if c.sni]
    default = next((i for i, c in enumerate(tls.certificates) if not c.sni), 0)
    return [*chains, (default, ())]


def downstream_transport_socket(node: str, tls: GatewayTls, index: int) -> base_pb2.TransportSocket:
    name = secret_name(node, index)
    source = config_source_pb2.ConfigSource(
        path_config_source=config_source_pb2.PathConfigSource(
            path=_sds_path(tls, name),
            watched_directory=base_pb2.WatchedDirectory(path=tls.sds_dir),
        ),
        resource_api_version=config_source_pb2.V3,
    )
    common = tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=_VERSIONS[tls.min_version]
        ),
        alpn_protocols=list(tls.alpn),
        tls_certificate_sds_secret_configs=[
            secret_pb2.SdsSecretConfig(name=name, sds_config=source)
        ],
    )
    ctx = tls_pb2.DownstreamTlsContext(common_tls_context=common)
    client = tls.client_certificates
    if client is not None:
        ctx.common_tls_context.validation_context.CopyFrom(
            common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(filename=client.ca)
            )
        )
        ctx.require_client_certificate.CopyFrom(wrappers_pb2.BoolValue(value=client.required))
    return base_pb2.TransportSocket(name=_TLS_SOCKET, typed_config=any_of(ctx))


def tls_inspector() -> listener_components_pb2.ListenerFilter:
    return listener_components_pb2.ListenerFilter(
        name="envoy.filters.listener.tls_inspector",
        typed_config=any_of(tls_inspector_pb2.TlsInspector()),
    )


def client_cert_forwarding(hcm: hcm_pb2.HttpConnectionManager, tls: GatewayTls | None) -> None:
    """Never trust a client's ``x-forwarded-client-cert``; with mTLS, set it from the verified
    certificate."""
    HCM = hcm_pb2.HttpConnectionManager
    if tls is None or tls.client_certificates is None:
        hcm.forward_client_cert_details = HCM.SANITIZE
        return
    hcm.forward_client_cert_details = HCM.SANITIZE_SET
    hcm.set_current_client_cert_details.CopyFrom(
        HCM.SetCurrentClientCertDetails(
            subject=wrappers_pb2.BoolValue(value=True), uri=True, dns=True
        )
    )


def upstream_transport_socket(tls: UpstreamTls) -> base_pb2.TransportSocket:
    validation = common_pb2.CertificateValidationContext(
        trusted_ca=base_pb2.DataSource(filename=tls.ca or "")
    )
    if tls.sni:
        validation.match_typed_subject_alt_names.append(
            common_pb2.SubjectAltNameMatcher(
                san_type=common_pb2.SubjectAltNameMatcher.DNS,
                matcher=string_pb2.StringMatcher(exact=tls.sni),
            )
        )
    common = tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=common_pb2.TlsParameters.TLSv1_2
        ),
        validation_context=validation,
        alpn_protocols=list(tls.alpn),
    )
    if tls.cert and tls.key:
        common.tls_certificates.append(
            common_pb2.TlsCertificate(
                certificate_chain=base_pb2.DataSource(filename=tls.cert),
                private_key=base_pb2.DataSource(filename=tls.key),
            )
        )
    ctx = tls_pb2.UpstreamTlsContext(common_tls_context=common, sni=tls.sni or "")
    return base_pb2.TransportSocket(name=_TLS_SOCKET, typed_config=any_of(ctx))
