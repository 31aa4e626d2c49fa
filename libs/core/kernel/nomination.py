"""How long a preemptor's nomination lasts: one rule that quota (the quota its victims free) and placement (the
capacity they free) both apply, and the guarantee checker verifies.

When the preemption service decides to evict victims for a waiting job (`PreemptionDecided`), that job is
nominated: quota and placement hold back what its victims free for it. A preemptor that never gets its quota or
its place must not hold anything back forever, so its claim lapses NOMINATION_TTL_S after the decision, on the
log's clock (a clock tick), in both deciders alike.
"""

from __future__ import annotations

NOMINATION_TTL_S = 120.0
