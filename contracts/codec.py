"""One encoder and one decoder for the whole log, so every process agrees byte for byte."""

from __future__ import annotations

import msgspec

from contracts.events import Event

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)


def encode(event: msgspec.Struct) -> bytes:
    return _encoder.encode(event)


def decode(payload: bytes) -> Event:
    """Raises msgspec.DecodeError / msgspec.ValidationError with a message naming the bad field."""
    return _decoder.decode(payload)
