"""Model registry on MLflow: every trained model is a run plus a registered model version;
the aliases `champion` and `challenger` say which version serves and which is being gated."""

from lattice.registry.client import CHALLENGER, CHAMPION, ModelRegistry, VersionInfo

__all__ = ["CHALLENGER", "CHAMPION", "ModelRegistry", "VersionInfo"]
