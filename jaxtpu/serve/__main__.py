"""`python -m jaxtpu.serve`: the command (`jaxtpu.serve.command`)."""

import sys

from jaxtpu.serve.command import main

sys.exit(main())
