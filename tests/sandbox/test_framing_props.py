"""Properties of the agent wire protocol's framing: ``>II`` sizes, JSON header, payload.

- Round trip: any sequence of frames, cut into any chunks, comes out whole and in order.
- A truncated stream yields exactly the frames it holds in full and then waits: never a
  partial frame, never an error; the rest, fed later, completes it.
- A size above ``MAX_FRAME`` is refused as soon as the 8 size bytes are in (nothing is
  buffered waiting for a gigabyte), and a stream that was refused stays refused.
- Any bytes at all give frames with a JSON-object header, waiting, or ``ValueError``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rockroll.sandbox.protocol.frames import FRAME, MAX_FRAME, FrameReader, encode_frame  # noqa: I001 (the agent may move)

PROPS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
headers = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
frames = st.lists(st.tuples(headers, st.binary(max_size=300)), max_size=4)


def normal(value):
    """What a JSON round trip makes of a value (inf survives; tuples become lists)."""
    return json.loads(json.dumps(value))


def cut(data: bytes, points: list[int]) -> list[bytes]:
    points = sorted({min(p, len(data)) for p in points})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:])]


def drain(reader: FrameReader) -> list:
    return list(reader.frames())


@PROPS
@given(frames, st.lists(st.integers(0, 4000), max_size=12))
def test_frames_round_trip_through_any_chunking(sent, points):
    stream = b"".join(encode_frame(h, p) for h, p in sent)
    reader, got = FrameReader(), []
    for chunk in cut(stream, points):
        reader.feed(chunk)
        got += drain(reader)
    assert got == [(normal(h), p) for h, p in sent]
    assert all(type(h) is dict and type(p) is bytes for h, p in got)
    assert drain(reader) == []  # nothing left over


@PROPS
@given(frames, st.data())
def test_a_truncated_stream_yields_only_whole_frames_then_waits(sent, data):
    encoded = [encode_frame(h, p) for h, p in sent]
    stream = b"".join(encoded)
    at = data.draw(st.integers(0, len(stream)))
    reader = FrameReader()
    reader.feed(stream[:at])
    got = drain(reader)
    ends = [sum(map(len, encoded[: i + 1])) for i in range(len(encoded))]
    whole = sum(1 for e in ends if e <= at)
    assert got == [(normal(h), p) for h, p in sent[:whole]]
    assert drain(reader) == []  # waiting is not an error, and asking again changes nothing
    reader.feed(stream[at:])
    assert drain(reader) == [(normal(h), p) for h, p in sent[whole:]]


@PROPS
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), frames)
def test_sizes_above_max_frame_are_refused_from_the_size_bytes_alone(hlen, plen, before):
    reader = FrameReader()
    reader.feed(b"".join(encode_frame(h, p) for h, p in before))
    reader.feed(FRAME.pack(hlen, plen))
    if max(hlen, plen) > MAX_FRAME:
        got = []
        with pytest.raises(ValueError, match="oversized"):
            for frame in reader.frames():
                got.append(frame)
        assert got == [(normal(h), p) for h, p in before]  # the frames before it still arrive
        with pytest.raises(ValueError):  # a refused stream stays refused: no resync into garbage
            drain(reader)
    elif hlen == plen == 0:  # complete at once, and an empty header is not a JSON object
        with pytest.raises(ValueError):
            drain(reader)
    else:
        assert drain(reader) == [(normal(h), p) for h, p in before]  # and then it waits for the body


@PROPS
@given(st.binary(max_size=200) | st.builds(lambda h, b: FRAME.pack(len(h), len(b)) + h + b,
                                         st.binary(max_size=40) | st.text(max_size=20).map(str.encode)
                                         | json_values.map(lambda v: json.dumps(v).encode()),
                                         st.binary(max_size=20)),
       st.lists(st.integers(0, 300), max_size=6))
def test_any_bytes_give_object_headers_or_a_value_error(stream, points):
    reader = FrameReader()
    try:
        for chunk in cut(stream, points):
            reader.feed(chunk)
            for header, payload in reader.frames():
                assert type(header) is dict and type(payload) is bytes
    except ValueError:
        with pytest.raises(ValueError):  # poisoned for good
            drain(reader)


@PROPS
@given(headers)
def test_the_header_is_compact_json_and_sizes_are_exact(header):
    frame = encode_frame(header, b"xyz")
    hlen, plen = FRAME.unpack_from(frame)
    assert len(frame) == FRAME.size + hlen + plen and plen == 3 and frame.endswith(b"xyz")
    text = frame[FRAME.size:FRAME.size + hlen].decode()
    assert "\n" not in text and normal(header) == json.loads(text)
