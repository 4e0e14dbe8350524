"""extender/cri/api.proto: the CRI image service's wire contract, and checked-in stubs that match it.

The contract rows are k8s.io/cri-api v0.36.3's ``pkg/apis/runtime/v1/api.proto``: what containerd
and CRI-O serve, by package, method, field number and type. A renamed field keeps working in
Python; a renumbered one reads another field of the runtime's answer. These rows catch both. The
stubs must be exactly what ``scripts/generate-grpc-stubs`` writes with the pinned grpcio-tools.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from extender.cri import api_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")

S, I64, U64, B, MSG = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64,
                       FieldDescriptor.TYPE_BOOL, FieldDescriptor.TYPE_MESSAGE)
#: (message, field, number, type, repeated), as upstream numbers them
FIELDS = [
    pytest.param("ListImagesRequest", "filter", 1, MSG, False, id="ListImagesRequest.filter"),
    pytest.param("ListImagesResponse", "images", 1, MSG, True, id="ListImagesResponse.images"),
    pytest.param("ImageFilter", "image", 1, MSG, False, id="ImageFilter.image"),
    pytest.param("ImageSpec", "image", 1, S, False, id="ImageSpec.image"),
    pytest.param("ImageSpec", "annotations", 2, MSG, True, id="ImageSpec.annotations"),  # map<string, string>
    pytest.param("ImageSpec", "user_specified_image", 18, S, False, id="ImageSpec.user_specified_image"),
    pytest.param("ImageSpec", "runtime_handler", 19, S, False, id="ImageSpec.runtime_handler"),
    pytest.param("ImageSpec", "image_ref", 20, S, False, id="ImageSpec.image_ref"),
    pytest.param("Image", "id", 1, S, False, id="Image.id"),
    pytest.param("Image", "repo_tags", 2, S, True, id="Image.repo_tags"),
    pytest.param("Image", "repo_digests", 3, S, True, id="Image.repo_digests"),
    pytest.param("Image", "size", 4, U64, False, id="Image.size"),
    pytest.param("Image", "uid", 5, MSG, False, id="Image.uid"),
    pytest.param("Image", "username", 6, S, False, id="Image.username"),
    pytest.param("Image", "spec", 7, MSG, False, id="Image.spec"),
    pytest.param("Image", "pinned", 8, B, False, id="Image.pinned"),
    pytest.param("Int64Value", "value", 1, I64, False, id="Int64Value.value"),
]


def test_package_service_and_method() -> None:
    assert pb.DESCRIPTOR.package == "runtime.v1"
    assert list(pb.DESCRIPTOR.services_by_name) == ["ImageService"]
    service = pb.DESCRIPTOR.services_by_name["ImageService"]
    assert list(service.methods_by_name) == ["ListImages"]
    method = service.methods_by_name["ListImages"]
    assert method.full_name == "runtime.v1.ImageService.ListImages"
    assert (method.input_type.name, method.output_type.name) == ("ListImagesRequest", "ListImagesResponse")
    assert (method.client_streaming, method.server_streaming) == (False, False)


@pytest.mark.parametrize(("message", "field", "number", "kind", "repeated"), FIELDS)
def test_fields(message: str, field: str, number: int, kind: int, repeated: bool) -> None:
    found = pb.DESCRIPTOR.message_types_by_name[message].fields_by_name[field]
    assert (found.number, found.type, found.is_repeated) == (number, kind, repeated)


def test_messages_have_no_other_fields() -> None:
    for name, message in pb.DESCRIPTOR.message_types_by_name.items():
        assert sorted(message.fields_by_name) == sorted(str(p.values[1]) for p in FIELDS if p.values[0] == name), name


def test_checked_in_stubs_are_what_the_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "generate-grpc-stubs"), "--out", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    for name in GENERATED:
        fresh = (tmp_path / "extender" / "cri" / name).read_text()
        assert fresh == (ROOT / "extender" / "cri" / name).read_text(), \
            f"extender/cri/{name} differs from what the generator writes: run scripts/generate-grpc-stubs"
