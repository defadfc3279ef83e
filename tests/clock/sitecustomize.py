"""The wall clock moved on for the whole test suite: `LGCKPT_CLOCK_SHIFT_DAYS=365 bash
scripts/test.sh` puts this folder on PYTHONPATH, and every Python process of the run (pytest,
its workers, the processes tests spawn) imports this at start-up.

time-machine moves what Python reads as the date (`time.time`, `time.time_ns`, `datetime.now`,
...) and leaves the monotonic clock alone, so that waits with a timeout still end on time.
(libfaketime cannot be used here: it also moves the monotonic clock, and a Python
`Event.wait(0.1)` under it then waits for a year.) Servers the tests talk to keep the machine's
clock, as real ones keep their own.
"""

from __future__ import annotations

import os

_days = os.environ.get("LGCKPT_CLOCK_SHIFT_DAYS")
if _days:
    import time

    import time_machine

    # A ticking traveller starts its clock at its first reading, not at `start()`: read it at
    # once, or every process runs behind by its own start-up time (a spawned worker by tens
    # of milliseconds), and the ids of two processes stop following the order of their writes.
    real = time.time_ns()  # not patched yet
    time_machine.travel((real + round(float(_days) * 86400e9)) / 1e9, tick=True).start()
    time.time_ns()
