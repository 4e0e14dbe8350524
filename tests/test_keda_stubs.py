"""extender/keda/externalscaler.proto: KEDA's wire contract, and checked-in stubs that match it.

The contract rows are KEDA's ``pkg/scalers/externalscaler/externalscaler.proto`` (kedacore/keda;
docs/kubernetes-interfaces.md section 7): what KEDA's generated client sends and expects, by
package, method, field number and type. A renamed field keeps working in Python and breaks KEDA;
these rows catch it. The stubs must be exactly what ``scripts/generate-grpc-stubs`` writes with
the pinned grpcio-tools, so nobody edits generated code by hand or forgets to regenerate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from extender.keda import externalscaler_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("externalscaler_pb2.py", "externalscaler_pb2.pyi", "externalscaler_pb2_grpc.py")

#: (method, request message, response message, server streams)
METHODS = [
    ("IsActive", "ScaledObjectRef", "IsActiveResponse", False),
    ("StreamIsActive", "ScaledObjectRef", "IsActiveResponse", True),
    ("GetMetricSpec", "ScaledObjectRef", "GetMetricSpecResponse", False),
    ("GetMetrics", "GetMetricsRequest", "GetMetricsResponse", False),
]

S, I64, F64, B, MSG = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_DOUBLE,
                       FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_MESSAGE)
#: (message, field, number, type, repeated)
FIELDS = [
    ("ScaledObjectRef", "name", 1, S, False),
    ("ScaledObjectRef", "namespace", 2, S, False),
    ("ScaledObjectRef", "scalerMetadata", 3, MSG, True),  # map<string, string>
    ("IsActiveResponse", "result", 1, B, False),
    ("GetMetricSpecResponse", "metricSpecs", 1, MSG, True),
    ("MetricSpec", "metricName", 1, S, False),
    ("MetricSpec", "targetSize", 2, I64, False),
    ("MetricSpec", "targetSizeFloat", 3, F64, False),
    ("GetMetricsRequest", "scaledObjectRef", 1, MSG, False),
    ("GetMetricsRequest", "metricName", 2, S, False),
    ("GetMetricsResponse", "metricValues", 1, MSG, True),
    ("MetricValue", "metricName", 1, S, False),
    ("MetricValue", "metricValue", 2, I64, False),
    ("MetricValue", "metricValueFloat", 3, F64, False),
]


def test_package_and_service() -> None:
    assert pb.DESCRIPTOR.package == "externalscaler"
    assert list(pb.DESCRIPTOR.services_by_name) == ["ExternalScaler"]


@pytest.mark.parametrize(("method", "request_type", "response_type", "streams"), METHODS, ids=[m[0] for m in METHODS])
def test_methods(method: str, request_type: str, response_type: str, streams: bool) -> None:
    found = pb.DESCRIPTOR.services_by_name["ExternalScaler"].methods_by_name[method]
    assert found.full_name == f"externalscaler.ExternalScaler.{method}"
    assert (found.input_type.name, found.output_type.name) == (request_type, response_type)
    assert (found.client_streaming, found.server_streaming) == (False, streams)


def test_no_other_methods() -> None:
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert sorted(service.methods_by_name) == sorted(m[0] for m in METHODS)


@pytest.mark.parametrize(("message", "field", "number", "kind", "repeated"), FIELDS,
                         ids=[f"{f[0]}.{f[1]}" for f in FIELDS])
def test_fields(message: str, field: str, number: int, kind: int, repeated: bool) -> None:
    found = pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (found.number, found.type, found.is_repeated) == (number, kind, repeated)


def test_messages_have_no_other_fields() -> None:
    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        assert sorted(message.fields_by_name) == sorted(f[1] for f in FIELDS if f[0] == name), name


def test_scaler_metadata_is_a_string_map() -> None:
    entry = pb.DESCRIPTOR.message_types_by_name["ScaledObjectRef"].fields_by_name["scalerMetadata"].message_type
    assert entry is not None
    assert entry.GetOptions().map_entry
    assert [(f.name, f.type) for f in entry.fields] == [("key", S), ("value", S)]


def test_checked_in_stubs_are_what_the_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate-grpc-stubs"), "--out", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for name in GENERATED:
        fresh = (tmp_path / "extender" / "keda" / name).read_text()
        assert fresh == (ROOT / "extender" / "keda" / name).read_text(), \
            f"extender/keda/{name} differs from what the generator writes: run scripts/generate-grpc-stubs"
