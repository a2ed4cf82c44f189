"""The spot preemption notice, in one place: the pod's grace period and the worker's stop budgets all
derive from `GRACE_PERIOD_S` (infra/jobs.py sets the Jobs' terminationGracePeriodSeconds from it)."""

from __future__ import annotations

# A preempted spot node gives non-system pods 15 s between SIGTERM and SIGKILL: by default GKE splits the
# 30 s after the preemption notice into 15 s for ordinary pods, then 15 s for critical system pods
# (GKE docs, concepts/spot-vms, "Termination and graceful shutdown of Spot VMs"). A longer grace
# period in the pod spec buys nothing: the node shuts down regardless.
GRACE_PERIOD_S = 15

# After SIGTERM the worker ends its own process this long before the kubelet's SIGKILL would.
KILL_MARGIN_S = 2
# SIGTERM ends the worker within this, whatever it waits on (WorkerConfig.term_grace_s).
STOP_WITHIN_S = GRACE_PERIOD_S - KILL_MARGIN_S

# A final checkpoint after SIGTERM is started only if the last one took less than the budget, so one
# that takes as long again still leaves this long to release the lease and exit.
RELEASE_MARGIN_S = 5
CHECKPOINT_BUDGET_S = STOP_WITHIN_S - RELEASE_MARGIN_S  # WorkerConfig.term_budget_s
