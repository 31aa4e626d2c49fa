"""`gpusched token create|list|revoke`: the API's bearer tokens (docs/security.md).

A new token is printed once and never stored: the tokens file keeps only its sha256 digest, with the token's
name, team and role. The file is rewritten atomically and readable by its owner only; a running API picks
the change up within a second or two.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from libs.cli.output import add_json_flag, add_table_flags, wide
from libs.cli.tables import Column, print_table
from libs.runtime.api_tokens import (
    ROLES,
    TOKENS_ENV,
    TokenEntry,
    entry_from,
    hash_token,
    new_token,
    read_tokens,
    write_tokens,
)

TOKEN_COLUMNS: list[Column[TokenEntry]] = [
    Column("NAME", lambda e: e.name), Column("TEAM", lambda e: e.team), Column("ROLE", lambda e: e.role)]


def tokens_path(args: argparse.Namespace) -> Path:
    path = args.file or os.environ.get(TOKENS_ENV, "")
    if not path:
        raise ValueError(f"give --file or set {TOKENS_ENV}")
    return Path(path)


def _existing(path: Path) -> list[TokenEntry]:
    return read_tokens(path) if path.exists() else []


def cmd_create(args: argparse.Namespace) -> None:
    path = tokens_path(args)
    entries = _existing(path)
    if any(e.name == args.name for e in entries):
        raise ValueError(f"a token named {args.name!r} exists in {path}; revoke it first or pick another name")
    token = new_token()
    entry = entry_from({"name": args.name, "team": args.team, "role": args.role, "hash": hash_token(token)},
                       "the new token")
    write_tokens(path, [*entries, entry])
    if args.json:
        print(json.dumps({"name": entry.name, "team": entry.team, "role": entry.role, "token": token,
                          "file": str(path)}))
    else:
        print(token)
        print(f"token {entry.name!r} ({entry.role} of team {entry.team!r}) added to {path}; it is shown only "
              "this once: keep it in a secret store, give it with GPUSCHED_TOKEN or GPUSCHED_TOKEN_FILE",
              file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> None:
    entries = _existing(tokens_path(args))
    if args.json:
        print(json.dumps([{"name": e.name, "team": e.team, "role": e.role} for e in entries], indent=2))
        return
    print_table(None, TOKEN_COLUMNS, entries, wide(args))


def cmd_revoke(args: argparse.Namespace) -> None:
    path = tokens_path(args)
    entries = _existing(path)
    kept = [e for e in entries if e.name != args.name]
    if len(kept) == len(entries):
        raise ValueError(f"no token named {args.name!r} in {path}")
    write_tokens(path, kept)
    if args.json:
        print(json.dumps({"name": args.name, "revoked": True, "file": str(path)}))
    print(f"token {args.name!r} revoked", file=sys.stderr)


def add_command(sub: argparse._SubParsersAction) -> None:
    token = sub.add_parser("token", help="API bearer tokens: create (printed once), list, revoke")
    tsub = token.add_subparsers(dest="token_command", required=True)
    p = tsub.add_parser("create", help="make a token, print it once, store only its hash")
    p.add_argument("--name", required=True, help="who or what uses it (unique in the file)")
    p.add_argument("--team", required=True)
    p.add_argument("--role", required=True, choices=ROLES)
    add_json_flag(p)
    p.set_defaults(func=cmd_create)
    p = tsub.add_parser("list", help="names, teams and roles (never hashes)")
    add_table_flags(p)
    p.set_defaults(func=cmd_list)
    p = tsub.add_parser("revoke", help="remove a token by name")
    p.add_argument("--name", required=True)
    add_json_flag(p)
    p.set_defaults(func=cmd_revoke)
    for p in tsub.choices.values():
        p.add_argument("--file", help=f"the tokens file (default: ${TOKENS_ENV}); .toml for TOML, else JSON")

