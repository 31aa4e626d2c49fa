"""Write the JSON Schema of every command and event: `python -m contracts.export [--check]`.

The committed file is what other teams code against; a test fails when it drifts from the Structs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from contracts.events import Event
from contracts.views import ApiError, JobCreated, JobView, NodeView, QueueView, ServiceView, TeamUsage

SCHEMA_PATH = Path(__file__).parent / "schema" / "gpusched.schema.json"


def schema_text() -> str:
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gpusched log and API contracts",
        "event": msgspec.json.schema(Event),
        "views": msgspec.json.schema_components((JobView, QueueView, NodeView, TeamUsage, ApiError, JobCreated,
                                                   ServiceView))[1],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main() -> None:
    text = schema_text()
    if "--check" in sys.argv:
        if SCHEMA_PATH.read_text() != text:
            sys.exit(f"{SCHEMA_PATH} is out of date: run python -m contracts.export")
        return
    SCHEMA_PATH.write_text(text)
    print(f"wrote {SCHEMA_PATH}")


if __name__ == "__main__":
    main()
