"""What accelerators this host has, read from the operating system before any framework
starts (framework-free): both sides decide their runtime set-up from it.
"""

from __future__ import annotations

import glob
from pathlib import Path

_GOOGLE_PCI_VENDOR = "0x1ae0"


def has_tpu() -> bool:
    """A TPU chip on this host: a Google PCI device, or the TPU driver's device files
    (/dev/accel* on v2-v4, /dev/vfio/N on v5 and later)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if Path(vendor).read_text().strip() == _GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
