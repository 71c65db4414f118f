"""The gateway examples under deploy/gateways ship access logs that prewarm's ingest accepts.

Neither Vector nor Fluent Bit nor a gateway installs here, so each example is read: the fields its log
format writes and its shipper assigns must be fields of the request-log schema (``prewarm.RequestEvent``),
a sample line with every variable filled in must parse as a request event, and the Kafka sinks must write
to the request-log topic, keyed by model, in a compression prewarm's consumer reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from prewarm import KafkaSettings, RequestEvent, Tier, parse_request_event

GATEWAYS = Path(__file__).resolve().parents[2] / "deploy" / "gateways"
SCHEMA_FIELDS = set(RequestEvent.model_fields)
REQUIRED = {name for name, f in RequestEvent.model_fields.items() if f.is_required()}
TOPIC = KafkaSettings.model_fields["topic_requests"].default
# What prewarm's consumer decodes (kafka-python without the lz4/snappy/zstd extras).
READABLE_COMPRESSION = {"none", "gzip"}

# What NGINX puts in each variable for one proxied request (a header the upstream did not send is "").
NGINX_SAMPLE = {
    "time_iso8601": "2026-12-01T18:04:05+00:00",
    "upstream_http_x_prewarm_model": "org/llama-8b",
    "upstream_http_x_prewarm_model_version": "3",
    "http_x_tenant_id": "",
    "hostname": "gw-7",
    "status": "200",
    "upstream_http_x_prewarm_served_from": "L2",
    "upstream_http_x_prewarm_wait_ms": "18250",
    "request_time": "19.204",
}
# What Envoy writes for each command operator in a typed json_format (absent headers are null).
ENVOY_SAMPLE: dict[str, Any] = {
    "%START_TIME%": "2026-12-01T18:04:05.123Z",
    "%RESP(X-PREWARM-MODEL)%": "org/llama-8b",
    "%RESP(X-PREWARM-MODEL-VERSION)%": None,
    "%REQ(X-TENANT-ID)%": "acme",
    "%HOSTNAME%": "envoy-2",
    "%RESPONSE_CODE%": 200,
    "%DURATION%": 412,
    "%RESP(X-PREWARM-SERVED-FROM)%": "L0",
    "%RESP(X-PREWARM-WAIT-MS)%": None,
}


def nginx_log_format() -> str:
    text = (GATEWAYS / "nginx.conf").read_text()
    body = text[text.index("log_format prewarm") :].split(";", 1)[0]
    return "".join(re.findall(r"'([^']*)'", body))


def vrl_source() -> str:
    config = yaml.safe_load((GATEWAYS / "vector.yaml").read_text())
    return str(config["transforms"]["request_events"]["source"])


def ship_like_the_vector_remap(line: dict[str, Any]) -> dict[str, Any]:
    """The remap's statements, one for one (test_vector_remap_writes_only_request_event_fields pins them)."""
    event = {k: v for k, v in line.items() if v not in ("", None)}  # compact(., string: true, null: true)
    event["v"] = 1
    event["status"] = int(event["status"])
    event["latency_ms"] = float(event.pop("request_time_s")) * 1000.0
    if "wait_ms" in event:
        event["wait_ms"] = float(event["wait_ms"])
    return event


def test_nginx_log_format_writes_request_event_fields_and_one_the_shipper_converts() -> None:
    template = nginx_log_format()
    keys = set(json.loads(re.sub(r"\$\w+", "x", template)))
    assert keys >= REQUIRED
    assert keys - SCHEMA_FIELDS == {"request_time_s"}


def test_vector_remap_writes_only_request_event_fields() -> None:
    source = vrl_source()
    assigned = set(re.findall(r"\.(\w+)\s*=(?!=)", source))
    assert assigned <= SCHEMA_FIELDS
    assert assigned == {"v", "status", "latency_ms", "wait_ms"}
    assert set(re.findall(r"del\(\.(\w+)\)", source)) == {"request_time_s"}
    assert "compact(., string: true" in source  # NGINX's "" for an absent header is dropped


def test_a_sample_nginx_line_shipped_by_vector_is_a_valid_request_event() -> None:
    line = json.loads(re.sub(r"\$(\w+)", lambda m: NGINX_SAMPLE[m.group(1)], nginx_log_format()))
    event = parse_request_event(json.dumps(ship_like_the_vector_remap(line)).encode())
    assert (event.model, event.version, event.status, event.served_from) == (
        "org/llama-8b",
        "3",
        200,
        Tier.L2,
    )
    assert event.tenant is None
    assert event.latency_ms == pytest.approx(19_204.0)
    assert event.wait_ms == 18_250.0
    assert event.cold_start
    assert event.ts == 1_796_148_245_000


def test_envoy_json_format_writes_only_request_event_fields() -> None:
    config = yaml.safe_load((GATEWAYS / "envoy-access-log.yaml").read_text())
    fields = config["access_log"][0]["typed_config"]["log_format"]["json_format"]
    assert REQUIRED <= set(fields) <= SCHEMA_FIELDS


def test_a_sample_envoy_line_is_a_valid_request_event_as_fluent_bit_forwards_it() -> None:
    config = yaml.safe_load((GATEWAYS / "envoy-access-log.yaml").read_text())
    fields = config["access_log"][0]["typed_config"]["log_format"]["json_format"]
    line = {k: ENVOY_SAMPLE.get(v, v) for k, v in fields.items()}
    line["@fluentbit_ts"] = 1796148245.2  # Fluent Bit's own timestamp_key: ignored by the schema
    event = parse_request_event(json.dumps(line).encode())
    assert (event.model, event.tenant, event.status, event.served_from) == (
        "org/llama-8b",
        "acme",
        200,
        Tier.L0,
    )
    assert event.latency_ms == 412
    assert not event.cold_start
    assert event.ts == 1_796_148_245_123


def test_vector_sink_writes_the_request_log_topic_keyed_by_model_in_a_readable_compression() -> None:
    sink = yaml.safe_load((GATEWAYS / "vector.yaml").read_text())["sinks"]["prewarm_requests"]
    assert (sink["type"], sink["topic"], sink["key_field"], sink["encoding"]["codec"]) == (
        "kafka",
        TOPIC,
        "model",
        "json",
    )
    assert sink["compression"] in READABLE_COMPRESSION
    assert sink["inputs"] == ["request_events"]


def test_fluent_bit_output_writes_the_request_log_topic_keyed_by_model_in_a_readable_compression() -> None:
    config = yaml.safe_load((GATEWAYS / "fluent-bit.yaml").read_text())
    [source] = config["pipeline"]["inputs"]
    [output] = config["pipeline"]["outputs"]
    assert (output["name"], output["topics"], output["message_key_field"], output["format"]) == (
        "kafka",
        TOPIC,
        "model",
        "json",
    )
    assert output["rdkafka.compression.codec"] in READABLE_COMPRESSION
    assert output["match"] == source["tag"]
    assert output["timestamp_key"] not in SCHEMA_FIELDS
