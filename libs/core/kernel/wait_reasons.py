"""The reason codes a waiting job is told, where more than one party reads them: the quota decider writes them
(QuotaDeferred) and placement some (PlacementDeferred); the preemption decider acts on them, and the guarantee
checker (libs/audit/guarantees) verifies the claim each one makes. Defined once here, so that a code cannot
drift apart between the decider that writes it and those that read it."""

from __future__ import annotations

# Quota's deferrals (QuotaDeferred.code).
QUEUE_QUOTA_EXHAUSTED = "queue_quota_exhausted"  # at nominal (plus borrowing limit, in a cohort)
COHORT_QUOTA_EXHAUSTED = "cohort_quota_exhausted"  # must borrow; the cohort has nothing idle to lend
QUOTA_LENT_OUT = "quota_lent_out"  # fits its nominal, but borrowers hold the lendable part: reclaim
BEHIND_HIGHER_PRIORITY = "behind_higher_priority"
USER_LIMIT = "user_limit"
BUDGET_SPENT = "budget_spent"
HELD_FOR_STARVING_JOB = "held_for_starving_job"  # (placement tells it too, for a starving job's GPUs)
OVER_BUDGET_WAITS = "over_budget_waits_for_idle_quota"
RETRY_BACKOFF = "retry_backoff"
# Inadmissible as the policy is now (libs/core/kernel/inadmissible.py): admitted, it waits holding nothing until
# a policy change gives it room. More than its queue could ever hold as its quota is now; no quota of its models.
EXCEEDS_QUEUE_QUOTA = "exceeds_queue_quota"
NO_QUOTA_FOR_MODELS = "no_quota_for_models"
INADMISSIBLE = frozenset({EXCEEDS_QUEUE_QUOTA, NO_QUOTA_FOR_MODELS})
PARENT_QUOTA_EXHAUSTED = "parent_quota_exhausted"  # its queue has room, its parent's subtree does not
NOMINAL_QUOTA_ONLY = "nominal_quota_only"  # a job that cannot be preempted never borrows: its queue is at nominal
# No node present could hold it, not even with every running job gone: it is no starving job (it holds nobody
# for starvation) until a node that could hold it registers or comes back.
NO_NODE_COULD_HOLD = "no_node_could_hold"
PLACEMENT_TIMED_OUT = "placement_timed_out"  # no node held it in time: its quota went back; it waits a backoff
# Placement's answer to quota asking a reservation back (QuotaRecalled): it let the job go, unplaced, and will
# not place it until quota reserves it again; quota releases the reservation on this answer.
RESERVATION_RETURNED = "reservation_returned"
BACKING_OFF = frozenset({RETRY_BACKOFF, PLACEMENT_TIMED_OUT})
# Deferrals that evicting other jobs can cure: the preemption service acts on these.
PREEMPTION_MAY_HELP = frozenset({QUEUE_QUOTA_EXHAUSTED, COHORT_QUOTA_EXHAUSTED, QUOTA_LENT_OUT, PARENT_QUOTA_EXHAUSTED,
                                 NOMINAL_QUOTA_ONLY})
WAITING_FOR_QUOTA = PREEMPTION_MAY_HELP | {BEHIND_HIGHER_PRIORITY}
# Who may be the starving job, by its last reason: one told no node could hold it too, as that may have changed
# since (a node came back) with nothing to tell it yet; the inventory is asked again (quota_fit.could_hold).
WAITING_OR_HELD = WAITING_FOR_QUOTA | {HELD_FOR_STARVING_JOB, NO_NODE_COULD_HOLD}
BUDGET_WAITS = frozenset({BUDGET_SPENT, OVER_BUDGET_WAITS})

# A preemptor's claim (its nomination, kernel/nomination.py) holds others back: quota tells a job whose
# reservation would leave the preemptor without room, placement one that would take the capacity its victims free.
HELD_FOR_PREEMPTOR = "held_for_preemptor"
RESERVED_FOR_PREEMPTOR = "reserved_for_preemptor"
