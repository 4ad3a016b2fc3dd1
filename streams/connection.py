"""How every Kafka client Somnus makes connects: the cluster's security options and the record limits.

Producers, consumers and admin clients of the worker, the projector, the publishing client and the
CLI all take ``**kafka_options(settings)``; the Faust app its ``broker_credentials`` made from the same.
"""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from somnus.config import Settings

KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# For records that can be large (a promotion request holds up to PROMOTION_WINDOW_CALLS calls, ~7 MB
# of JSON for the sample fleet): compressed on the wire (the broker's limit applies to that), and
# room in aiokafka's size check, which is made on the uncompressed record. zstd at Kafka's default
# level 3: about the size of gzip, which aiokafka runs at level 9 only, for a seventh of its CPU.
LARGE_RECORDS: dict[str, Any] = {"compression_type": "zstd", "max_request_size": 32 << 20}


def kafka_options(settings: Settings | None = None) -> dict[str, Any]:
    """The keyword arguments every aiokafka client (producer, consumer, admin) gets for the cluster's
    security settings; none for PLAINTEXT, the default. ``settings`` None: from the environment
    (``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``,
    ``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CAFILE``). The Faust app's ``broker_credentials`` are made
    from the same (``somnus.streams.app.broker_credentials``).

    >>> kafka_options(Settings.resolve(env={}))
    {}
    >>> opts = kafka_options(Settings.resolve(env={"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    ...     "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "KAFKA_SASL_USERNAME": "somnus", "KAFKA_SASL_PASSWORD": "pw"}))
    >>> sorted(opts.items())
    [('sasl_mechanism', 'SCRAM-SHA-512'), ('sasl_plain_password', 'pw'), ('sasl_plain_username', 'somnus'), ('security_protocol', 'SASL_PLAINTEXT')]
    """
    s = Settings.resolve() if settings is None else settings
    protocol = s.kafka_security_protocol.strip().upper()
    if protocol not in KAFKA_PROTOCOLS:
        raise ValueError(
            f"KAFKA_SECURITY_PROTOCOL: {s.kafka_security_protocol!r} is not one of {', '.join(KAFKA_PROTOCOLS)}"
        )
    if protocol == "PLAINTEXT":
        return {}
    out: dict[str, Any] = {"security_protocol": protocol}
    if protocol.endswith("SSL"):
        # The CA file names the cluster's certificate authority; without one the system's CAs are trusted.
        out["ssl_context"] = create_ssl_context(cafile=str(s.kafka_ssl_cafile) if s.kafka_ssl_cafile else None)
    if protocol.startswith("SASL"):
        mechanism = (s.kafka_sasl_mechanism or "PLAIN").strip().upper()
        if mechanism not in KAFKA_SASL_MECHANISMS:
            raise ValueError(
                f"KAFKA_SASL_MECHANISM: {s.kafka_sasl_mechanism!r} is not one of {', '.join(KAFKA_SASL_MECHANISMS)}"
            )
        if not s.kafka_sasl_username or s.kafka_sasl_password is None:
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
        out.update(
            sasl_mechanism=mechanism,
            sasl_plain_username=s.kafka_sasl_username,
            sasl_plain_password=s.kafka_sasl_password,
        )
    return out
