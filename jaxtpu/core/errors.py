"""Every error jaxtpu reports to a user, in one place (framework-free).

`UserError` and its kinds are bad input (flags, files, devices, checkpoints): the commands print
them as one line and exit 2. `TrainingError` is a run that cannot go on (a NaN loss): one line,
exit 1, finished checkpoints kept. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (flags, files, checkpoints): reported as one line, no traceback."""


class ConfigError(UserError):
    """A configuration value or flag the user gave is not valid."""


class DataError(UserError):
    """An input file is not usable; the message names the file, row and value."""


class DeviceError(UserError):
    """The requested devices are not available."""


class CheckpointError(UserError):
    """A checkpoint or model directory is missing, unreadable, or belongs to another model;
    the message names the path (and the first tensor that does not fit)."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); finished work is kept."""
