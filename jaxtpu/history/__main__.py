"""`python -m jaxtpu.history`: `jaxtpu history`."""

import sys

from jaxtpu.history import main

sys.exit(main())
