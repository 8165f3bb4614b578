"""The JSON codec of request and answer bodies.

orjson (the ``fast`` extra) when it is installed, else the standard library.
Both give the same values: orjson is only asked first, and anything it will
not take (an integer past 64 bits, a type it does not know) goes to ``json``
so the SDK accepts and raises exactly what it would without orjson.
"""

from __future__ import annotations

import json
from typing import Any

try:  # pragma: no cover - which branch runs depends on the environment
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

__all__ = ["dumps", "loads", "FAST"]

#: True when orjson encodes and decodes.
FAST = _orjson is not None


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


if _orjson is not None:
    _odumps = _orjson.dumps
    _oloads = _orjson.loads

    def dumps(obj: Any) -> bytes:
        """Compact JSON as UTF-8 bytes."""
        try:
            return _odumps(obj)
        except TypeError:
            return _std_dumps(obj)

    def loads(data: bytes | bytearray | str) -> Any:
        """Decode a JSON document."""
        try:
            return _oloads(data)
        except ValueError:
            # Same value or the same JSONDecodeError as without orjson.
            return json.loads(data)
else:  # pragma: no cover
    dumps = _std_dumps
    loads = json.loads
