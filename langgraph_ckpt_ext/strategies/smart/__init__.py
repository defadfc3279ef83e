"""`SmartCheckpointer`: a wrapper that holds each thread's checkpoints and writes in a buffer
and stores them in the checkpointer it wraps when they matter (see `checkpointer`).

One concern per module:
- `policies`: when a thread's buffer must be written (public; `strategies.policies` too);
- `items`: what a put or a put_writes becomes in the buffer (values serialized at hand-over);
- `buffer`: each thread's queue and the batches of it being written (the state machine);
- `overlay`: reads served from the buffer, or merged with what the inner checkpointer read;
- `flusher`: writing a thread's queue to the inner checkpointer, and the interval timer;
- `metrics`: what was requested, written and is waiting;
- `checkpointer`: the class, whose sync/async pairs run one coroutine each.

It may import `langgraph_ckpt_ext.core`, the time-travel helpers and the helpers the two
wrappers share (`strategies._forward`); never the backends, `cli` or `transfer`: the inner
checkpointer is handed in, and what the wrapper asks of it is named in `core.inner`.
"""

from .checkpointer import SmartCheckpointer
from .metrics import Metrics

__all__ = ["Metrics", "SmartCheckpointer"]
