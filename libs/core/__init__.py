"""The pure decision core: one decider per service.

Rules every module here keeps (a test and import-linter enforce the import rule):
- imports only `contracts`, `libs.core`, the standard library, msgspec (snapshots) and numpy (placement
  scoring, in integer arithmetic only, so that every machine computes the same scores);
- no wall clock, no randomness, no uuid4, no iteration over sets: `ctx.now` is the trigger's timestamp;
- every sort ends in a unique-id tie-break, so the same log always yields the same decisions.
"""
