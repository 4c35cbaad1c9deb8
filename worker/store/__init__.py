"""The one door to the database: every SQL statement of the worker, the pool, the migrations.

`RunStore` is the run table's gateway; its neighbours here hold the group commit, the migrations,
retention, the change feed the events API reads and the fleet-wide model-limit counters.
"""

from agentrun.worker.core.errors import LeaseLost as LeaseLost
from agentrun.worker.store.channels import LIVENESS_LOCK_CLASS as LIVENESS_LOCK_CLASS
from agentrun.worker.store.reads import RunFilter as RunFilter
from agentrun.worker.store.rows import DECISION_COLUMNS as DECISION_COLUMNS
from agentrun.worker.store.rows import RUN_COLUMNS as RUN_COLUMNS
from agentrun.worker.store.rows import TIMELINE_COLUMNS as TIMELINE_COLUMNS
from agentrun.worker.store.rows import Claim as Claim
from agentrun.worker.store.rows import DecideOutcome as DecideOutcome
from agentrun.worker.store.runs import RunStore as RunStore
from agentrun.worker.store.scoped import ScopedReads as ScopedReads
from agentrun.worker.store.workers import WorkerRow as WorkerRow
