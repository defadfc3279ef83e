"""The replicator process's entry point (`python -m langgraph_ckpt_ext.strategies.replication`,
started by `process.Replicator`): `child.child_main`."""

from .child import child_main

child_main()
