"""`ReplicatedCheckpointer`: a primary and replicas of any backend, with the consistency the
user chooses (see `checkpointer.py`), one concern per module:

- `options`: the checked options and replicas as given; `status`: what the user reads
  (`status()`, `repair()` reports);
- `queue`: what is queued for a replica (ops in the primary's order, quorum acks);
  `health`: what every replica view keeps; `worker`: a replica applied by a thread here;
  `process`, `pipe`, `child`: replicas applied by the replicator process;
  `fanout`: the replica views and the order ops go to them in;
- `failures`: which errors are outages and which are refusals, per saver; `failover`: the
  primary and where a call goes while it is down; `gate`: repairs and writes of a thread
  exclude each other; `writes`: how a write goes (async or quorum); `repair`: `repair()` and
  the background repair; `calls`: how each call, written once, runs sync or async;
  `interface`: LangGraph's saver methods over the failover and the writer.

May import `core` (and `timetravel.methods`, `transfer` for repairs, `connect` for replicas
given as URLs, as the checkpointers do), and `backends.sqlstate` only: the PostgreSQL
refusal rule, driver-free, for a LangGraph `PostgresSaver` wrapped here (our savers classify
their own errors). Never `cli`. No module here imports `checkpointer` but this one.
"""

from ...core.errors import PrimaryUnavailableError, QuorumUnavailableError, ReplicationError
from .checkpointer import ReplicatedCheckpointer
from .failures import RemoteError
from .options import Consistency
from .status import RepairReport, ReplicaRepair, ReplicaStatus, ReplicationStatus

__all__ = [
    "Consistency",
    "PrimaryUnavailableError",
    "QuorumUnavailableError",
    "RemoteError",
    "RepairReport",
    "ReplicaRepair",
    "ReplicaStatus",
    "ReplicatedCheckpointer",
    "ReplicationError",
    "ReplicationStatus",
]
