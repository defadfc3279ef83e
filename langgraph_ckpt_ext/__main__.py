"""`python -m langgraph_ckpt_ext`: the `lgckpt` command line."""

import sys

from .cli import main

sys.exit(main())
