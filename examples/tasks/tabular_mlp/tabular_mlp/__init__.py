"""An example third-party task for the HPO service: ``tabular-mlp`` (see ``task.py``)."""

from tabular_mlp.task import TabularMLPTask, TabularOptions

__all__ = ["TabularMLPTask", "TabularOptions"]
