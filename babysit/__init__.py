"""babysit: a babysitter daemon for GPU training runs. For trainers: `babysit.log(step, **metrics)`.

Kept light on purpose: importing babysit imports no ML framework (torch, transformers, lightning).
"""

from babysit.integrations.client import log

__all__ = ["log"]
