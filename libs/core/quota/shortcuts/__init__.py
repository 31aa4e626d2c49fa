"""Quota's speed shortcuts, apart from the meaning: what a scheduling cycle may keep between cycles or leave
out, each deciding exactly what the long way would (tests/unit/core/kernel/test_shortcuts_change_no_decision.py
switches each off and compares the logs; tests/unit/core/quota/test_quota_pass_caches.py compares what they keep
with what they would find)."""
