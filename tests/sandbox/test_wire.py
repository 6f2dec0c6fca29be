"""The wire protocols, without a sandbox: the guest's frames (``protocol/frames.py``:
``encode_frame`` / ``FrameReader``) and the HTTP service's models and error mapping
(``protocol/wire.py``).

Every expected byte string and status is written out by hand; the round trips through a
real agent and a real server are in test_api.py / test_remote.py. These are the fast tests
``make mutation`` runs against the two modules.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError

from rockroll.sandbox import errors
from rockroll.sandbox.protocol.frames import MAX_FRAME, FrameReader, encode_frame
from rockroll.sandbox.spec import CommandResult, SandboxSpec, Snapshot
from rockroll.sandbox.protocol.wire import (
    AuthError,
    ForkIn,
    ResultOut,
    SandboxOut,
    SnapshotOut,
    SpecIn,
    error_body,
    error_from_body,
    model_fields_of,
    status_of,
)

# --------------------------------------------------------------------------- agent frames

# {"op":"x"} is 10 bytes of compact JSON, the payload 2: sizes big-endian u32, u32
FRAME_X = b"\x00\x00\x00\x0a\x00\x00\x00\x02" + b'{"op":"x"}' + b"ab"


def test_encode_frame_bytes():
    assert encode_frame({"op": "x"}, b"ab") == FRAME_X
    # no payload: plen 0; header {"a":1,"b":[1,2]} = 17 bytes, no spaces
    assert encode_frame({"a": 1, "b": [1, 2]}) == b"\x00\x00\x00\x11\x00\x00\x00\x00" + b'{"a":1,"b":[1,2]}'


def test_frame_reader_byte_by_byte_and_back_to_back():
    reader = FrameReader()
    got = []
    two = FRAME_X + encode_frame({"op": "y"})
    for i in range(len(two)):
        reader.feed(two[i:i + 1])
        got += list(reader.frames())
        if i == len(FRAME_X) - 2:  # one byte short of the first frame: nothing yet
            assert got == []
        if i == len(FRAME_X) - 1:  # its last byte: exactly the first frame
            assert got == [({"op": "x"}, b"ab")]
    assert got == [({"op": "x"}, b"ab"), ({"op": "y"}, b"")]
    assert list(reader.frames()) == []  # consumed


def test_frame_reader_several_frames_in_one_feed_keeps_the_tail():
    reader = FrameReader()
    reader.feed(FRAME_X + FRAME_X + FRAME_X[:5])
    assert list(reader.frames()) == [({"op": "x"}, b"ab")] * 2
    reader.feed(FRAME_X[5:])
    assert list(reader.frames()) == [({"op": "x"}, b"ab")]


@pytest.mark.parametrize(("hlen", "plen"), [(MAX_FRAME + 1, 0), (0, MAX_FRAME + 1)])
def test_frame_reader_refuses_oversized_sizes_before_the_body_arrives(hlen, plen):
    reader = FrameReader()
    reader.feed(hlen.to_bytes(4, "big") + plen.to_bytes(4, "big"))  # just the 8 size bytes
    with pytest.raises(ValueError, match="oversized"):
        list(reader.frames())


def test_frame_reader_accepts_max_frame_sizes_and_waits():
    reader = FrameReader()
    reader.feed(MAX_FRAME.to_bytes(4, "big") + MAX_FRAME.to_bytes(4, "big"))
    assert list(reader.frames()) == []  # legal, incomplete: wait for the rest


# --------------------------------------------------------------------------- HTTP errors

STATUSES = [
    (errors.SandboxNotFound("x"), 404),
    (errors.SpecError("cpus", "bad"), 422),
    (errors.CapacityError("full"), 429),
    (errors.SandboxClosed("x"), 409),
    (errors.GuestDied("x"), 409),
    (errors.SandboxLost("x"), 409),  # an GuestDied
    (errors.SandboxStartError("x"), 503),
    (errors.IsolationUnavailable("x"), 503),
    (errors.UnsafeArchiveError("../a", "escapes"), 400),
    (errors.SnapshotError("x"), 400),
    (errors.SandboxFileNotFound("no such file: x"), 404),  # before its base, SandboxFileError
    (errors.SandboxFileError("x"), 400),
    (errors.SessionError("x"), 400),
    (errors.SandboxError("x"), 400),
]


@pytest.mark.parametrize(("exc", "status"), STATUSES, ids=[type(e).__name__ for e, _ in STATUSES])
def test_status_of_every_error(exc, status):
    assert status_of(exc) == status


def test_error_body_plain_and_round_trip():
    exc = errors.SandboxNotFound("no such sandbox", sandbox_id="sb-1")
    body = error_body(exc)
    assert body == {"error": "SandboxNotFound", "message": "no such sandbox", "sandbox_id": "sb-1"}
    back = error_from_body(404, body)
    assert type(back) is errors.SandboxNotFound
    assert back.args == ("no such sandbox",) and back.sandbox_id == "sb-1"


def test_a_missing_file_crosses_the_wire_as_itself():
    back = error_from_body(404, error_body(errors.SandboxFileNotFound("no such file: a", sandbox_id="sb-1")))
    assert type(back) is errors.SandboxFileNotFound and isinstance(back, FileNotFoundError)
    assert (back.args, back.sandbox_id) == (("no such file: a",), "sb-1")


def test_error_body_spec_error_names_the_field():
    body = error_body(errors.SpecError("memory_mb", "must be >= 16, not 1"))
    assert body == {"error": "SpecError", "message": "memory_mb: must be >= 16, not 1", "sandbox_id": None,
                    "field": "memory_mb",
                    "detail": [{"loc": ["body", "memory_mb"], "msg": "must be >= 16, not 1", "type": "value_error"}]}
    back = error_from_body(422, body)
    assert type(back) is errors.SpecError and back.field == "memory_mb"
    assert back.args == ("memory_mb: must be >= 16, not 1",)  # the prefix is not doubled


def test_error_body_spec_error_whose_message_lacks_the_prefix():
    exc = errors.SpecError("cpus", "x")
    exc.args = ("something else",)
    body = error_body(exc)
    assert body["detail"][0]["msg"] == "something else"
    assert body["message"] == "something else"


def test_error_body_capacity_and_unsafe_archive():
    body = error_body(errors.CapacityError("full", retry_after=2.5, sandbox_id=None))
    assert body == {"error": "CapacityError", "message": "full", "sandbox_id": None, "retry_after": 2.5}
    back = error_from_body(429, body)
    assert type(back) is errors.CapacityError and back.retry_after == 2.5 and back.args == ("full",)
    # a missing or zero retry_after falls back to 1 second
    assert error_from_body(429, {"error": "CapacityError", "message": "m"}).retry_after == 1.0

    body = error_body(errors.UnsafeArchiveError("../etc", "escapes the root", sandbox_id="sb-2"))
    assert body == {"error": "UnsafeArchiveError", "message": "unsafe archive member '../etc': escapes the root",
                    "sandbox_id": "sb-2", "member": "../etc", "reason": "escapes the root"}
    back = error_from_body(400, body)
    assert type(back) is errors.UnsafeArchiveError
    assert (back.member, back.reason, back.sandbox_id) == ("../etc", "escapes the root", "sb-2")


def test_error_body_message_is_the_first_arg():
    exc = errors.SandboxError("x")
    exc.args = ()
    assert error_body(exc)["message"] == ""
    exc.args = ("first", "second")
    assert error_body(exc)["message"] == "first"
    # only the field's own prefix is cut: the message may hold ": " itself
    body = error_body(errors.SpecError("env", "bad name: 1X"))
    assert body["detail"][0]["msg"] == "bad name: 1X"


def test_error_from_body_401_is_auth_error():
    assert type(error_from_body(401, {})) is AuthError
    assert error_from_body(401, {}).args == ("unauthorized: wrong or missing bearer token",)
    assert error_from_body(401, {"message": "token expired"}).args == ("token expired",)
    assert type(error_from_body(403, {"error": "AuthError", "message": "m"})) is AuthError


def test_error_from_body_fastapi_422_detail_names_the_field():
    body = {"detail": [{"loc": ["body", "spec", "cpus"], "msg": "Input should be a number", "type": "x"}]}
    exc = error_from_body(422, body)
    assert type(exc) is errors.SpecError
    assert exc.field == "spec.cpus" and exc.args == ("spec.cpus: Input should be a number",)
    # several problems: the first one is reported
    two = {"detail": [{"loc": ["body", "cpus"], "msg": "first"}, {"loc": ["body", "pids"], "msg": "second"}]}
    exc = error_from_body(422, two)
    assert exc.field == "cpus" and exc.args == ("cpus: first",)
    # only the first entry has to be FastAPI's shape
    exc = error_from_body(422, {"detail": [{"loc": ["body", "cpus"], "msg": "first"}, "junk"]})
    assert exc.field == "cpus" and exc.args == ("cpus: first",)
    # a loc of only "body" names the body; no msg says "invalid"
    exc = error_from_body(422, {"detail": [{"loc": ["body"]}]})
    assert exc.field == "body" and exc.args == ("body: invalid",)
    # no usable detail: the message, or the status
    assert error_from_body(422, {"detail": []}).args == ("body: HTTP 422",)
    assert error_from_body(422, {"message": "bad"}).args == ("body: bad",)
    # a SpecError name under another status is still a SpecError
    assert type(error_from_body(400, {"error": "SpecError", "message": "m"})) is errors.SpecError


def test_error_from_body_unknown_or_foreign_names_are_sandbox_errors():
    exc = error_from_body(500, {"error": "KeyError", "message": ""})  # not a SandboxError subclass
    assert type(exc) is errors.SandboxError
    assert exc.args == ("HTTP 500: {'error': 'KeyError', 'message': ''}",)
    exc = error_from_body(502, "<html>bad gateway</html>")  # not even a dict
    assert type(exc) is errors.SandboxError and exc.args == ("HTTP 502: {}",)
    exc = error_from_body(500, {"error": "Nope", "message": "boom", "sandbox_id": "sb-3"})
    assert type(exc) is errors.SandboxError and exc.args == ("boom",) and exc.sandbox_id == "sb-3"
    # a name the errors module holds that is not an exception class
    exc = error_from_body(500, {"error": "__name__", "message": "m"})
    assert type(exc) is errors.SandboxError and exc.args == ("m",)
    long = {"error": "Nope", "message": "", "junk": "y" * 500}
    assert len(error_from_body(500, long).args[0]) == len("HTTP 500: ") + 200  # body cut at 200 chars


# --------------------------------------------------------------------------- request models


def test_model_fields_of_defaults_factories_and_required():
    @dataclasses.dataclass
    class D:
        a: int
        b: str = "x"
        c: list = dataclasses.field(default_factory=list)

    fields = model_fields_of(D)
    assert fields["a"] == (int, ...)  # required
    assert fields["b"] == (str, "x")
    assert fields["c"][0] is list and fields["c"][1].default_factory is list


def test_spec_in_checks_by_sandbox_spec_and_forbids_extras():
    spec = SpecIn(memory_mb=256, backend="docker", snapshot="sha256:" + "a" * 64).to_spec("local")
    assert spec == SandboxSpec(memory_mb=256)  # backend is the service's own
    with pytest.raises(ValidationError):
        SpecIn(nope=1)
    with pytest.raises(ValidationError):
        SpecIn(snapshot="/etc/passwd")  # a digest only, never a path
    with pytest.raises(errors.SpecError, match="memory_mb"):
        SpecIn(memory_mb=1).to_spec("local")


@pytest.mark.parametrize(("n", "ok"), [(0, False), (1, True), (64, True), (65, False)])
def test_fork_in_bounds(n, ok):
    if ok:
        assert ForkIn(n=n).n == n
    else:
        with pytest.raises(ValidationError):
            ForkIn(n=n)
    assert ForkIn().n == 1


def test_result_and_snapshot_round_trip():
    r = CommandResult(exit_code=3, stdout="o", stderr="e", duration_s=0.5, timed_out=True)
    wire = json.loads(ResultOut.of(r).model_dump_json())
    assert wire == {"exit_code": 3, "stdout": "o", "stderr": "e", "duration_s": 0.5, "timed_out": True,
                    "truncated": False, "oom_killed": False}
    assert ResultOut(**wire).to_result() == r
    s = Snapshot(id="s1", digest="sha256:" + "b" * 64, size=10, layers=("sha256:a", "sha256:b"), image="img")
    out = SnapshotOut.of(s)
    assert out.layers == ["sha256:a", "sha256:b"]
    assert out.to_snapshot() == s


def test_sandbox_out_defaults():
    out = SandboxOut(id="sb-1", state="alive", spec={}, created=1.0, last_used=2.0)
    assert (out.commands_run, out.stats, out.recent) == (0, None, None)
