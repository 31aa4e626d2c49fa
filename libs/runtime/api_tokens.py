"""The API's tokens file: who may call the API, each a name, a team, a role and the SHA-256 digest of a bearer
token (never the token itself). Admission reads it (services/admission/auth.py); `gpusched token` writes it.
JSON (`{"tokens": [...]}`), or TOML (`[[tokens]]` tables) by the `.toml` suffix."""

from __future__ import annotations

import hashlib
import json
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libs.files import write_whole

TOKENS_ENV = "GPUSCHED_API_TOKENS_FILE"
SUBMITTER, OPERATOR, AUDITOR = "submitter", "operator", "auditor"
ROLES = (SUBMITTER, OPERATOR, AUDITOR)
HASH_PREFIX = "sha256:"
_HEX = frozenset("0123456789abcdef")


class TokenFileError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TokenEntry:
    name: str
    team: str
    role: str
    hash: str = field(repr=False)

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "team": self.team, "role": self.role, "hash": self.hash}


def new_token() -> str:
    """A fresh token: 256 random bits, URL-safe, with a prefix that secret scanners can recognise."""
    return "gst_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _text(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value or len(value) > 200 or not value.isprintable():
        raise TokenFileError(f"{where}: {key!r} must be a non-empty printable string of at most 200 characters")
    return value


def entry_from(row: object, where: str) -> TokenEntry:
    """One validated entry; a file with a bad one is refused whole (a typo must not open or close access)."""
    if not isinstance(row, Mapping):
        raise TokenFileError(f"{where}: an entry must be a table with name, team, role and hash")
    entry = TokenEntry(name=_text(row, "name", where), team=_text(row, "team", where),
                       role=_text(row, "role", where), hash=_text(row, "hash", where))
    if entry.role not in ROLES:
        raise TokenFileError(f"{where}: role must be one of {', '.join(ROLES)}, not {entry.role!r}")
    digest = entry.hash.removeprefix(HASH_PREFIX)
    if not entry.hash.startswith(HASH_PREFIX) or len(digest) != 64 or not set(digest) <= _HEX:
        raise TokenFileError(f"{where}: hash must be 'sha256:' and 64 lowercase hex digits")
    return entry


def read_tokens(path: Path) -> list[TokenEntry]:
    """The entries of a tokens file: `{"tokens": [{name, team, role, hash}, ...]}`, or `[[tokens]]` tables
    in TOML."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TokenFileError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {err}") from None
    rows = data.get("tokens", []) if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise TokenFileError(f"{path}: expected a list of entries under 'tokens'")
    entries = [entry_from(row, f"{path} entry {i + 1}") for i, row in enumerate(rows)]
    names = [e.name for e in entries]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TokenFileError(f"{path}: token names must be unique: {', '.join(duplicates)}")
    return entries


def _toml(entries: Sequence[TokenEntry]) -> str:
    # JSON strings without ASCII escaping are TOML basic strings (the entries hold no control characters).
    return "".join("[[tokens]]\n" + "".join(f"{k} = {json.dumps(v, ensure_ascii=False)}\n"
                                            for k, v in e.as_dict().items()) + "\n" for e in entries)


def write_tokens(path: Path, entries: Sequence[TokenEntry]) -> None:
    """Replace the file atomically, readable by its owner only (it holds no token, but it is the list of
    who may do what)."""
    if path.suffix == ".toml":
        text = _toml(entries)
    else:
        text = json.dumps({"tokens": [e.as_dict() for e in entries]}, indent=2) + "\n"
    write_whole(path, text, private=True)
