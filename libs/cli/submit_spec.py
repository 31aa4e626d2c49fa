"""The spec `gpusched submit` sends: a job file (YAML or JSON, `-` for stdin) with the flags over it.

Everything is checked against the contract (`JobSpec`) before anything is sent: a file's unknown field or
wrong type is an error naming the field, not a 400 from the API (or, worse, a field silently ignored).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import yaml

from contracts import JobSpec

FIELDS = tuple(f.name for f in msgspec.structs.fields(JobSpec))
_AT = re.compile(r"(?s)(.*) - at `\$(.*)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(.*)`")


def _problem(source: str, err: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.gpus`" as "job.yaml: field `gpus`: expected `int`, got `str`"."""
    text = str(err)
    match = _AT.fullmatch(text)
    detail, where = (match.group(1), match.group(2).lstrip(".")) if match else (text, "")
    where = where.replace("[...]", "[KEY]")  # msgspec's name for any value of a mapping (labels)
    unknown = _UNKNOWN.fullmatch(detail)
    if unknown and not where:
        name = unknown.group(1)
        close = difflib.get_close_matches(name, FIELDS, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else f"; a job spec's fields are: {', '.join(FIELDS)}"
        return f"{source}: unknown field `{name}`{hint}"
    detail = detail[:1].lower() + detail[1:]
    return f"{source}: field `{where}`: {detail}" if where else f"{source}: {detail}"


def read_spec_file(path: str) -> tuple[dict[str, Any], str]:
    """A job file's fields (checked against JobSpec, team and queue may be left to flags), and its name for
    messages. JSON when it looks like JSON, YAML otherwise (YAML holds JSON too, but reports JSON's errors less
    plainly)."""
    source = "stdin" if path == "-" else path
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    try:
        data = json.loads(text) if text.lstrip().startswith(("{", "[")) else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise ValueError(f"{source}: not valid YAML or JSON: {err}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a job file is a mapping of JobSpec fields (team, queue, gpus, ...), "
                         f"not a {type(data).__name__}")
    try:  # team and queue may come from flags: check the file's own fields now, the merged spec later
        msgspec.convert({"team": "", "queue": "", **data}, JobSpec)
    except msgspec.ValidationError as err:
        raise ValueError(_problem(source, err)) from None
    return data, source


def merged_spec(file_fields: dict[str, Any], flags: dict[str, Any], source: str = "") -> JobSpec:
    """The file's fields with the flags given over them, as a JobSpec. Each flag replaces its field, except
    labels, which are merged key by key (a flag's key wins)."""
    merged = {**file_fields, **flags}
    if "labels" in flags and isinstance(file_fields.get("labels"), dict):
        merged["labels"] = {**file_fields["labels"], **flags["labels"]}
    for name, flag in (("team", "--team"), ("queue", "--queue")):
        if not merged.get(name):
            where = f" or set `{name}` in the job file ({source})" if source else " (or give a job file with -f)"
            raise ValueError(f"the job needs a {name}: give {flag}{where}")
    try:
        return msgspec.convert(merged, JobSpec)
    except msgspec.ValidationError as err:
        raise ValueError(_problem(source or "the flags", err)) from None


def payload(spec: JobSpec) -> dict[str, Any]:
    """What is sent, as JSON has it: the fields that are not at their default (the API fills those in)."""
    result: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(spec))
    return result
