"""The one error type of the analysis layer."""
from __future__ import annotations


class AnalysisError(ValueError):
    """A bag or setting the analysis cannot use.

    An unreadable or truncated bag, a missing topic, a wrong message type, no overlap in time,
    joints that do not match the model. The message names the file, topic or field at
    fault (the CLI prints it and exits 2).
    """
