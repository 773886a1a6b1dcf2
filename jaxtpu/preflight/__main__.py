"""`python -m jaxtpu.preflight`: the command (`jaxtpu.preflight.command`)."""

import sys

from jaxtpu.preflight.command import main

sys.exit(main())
