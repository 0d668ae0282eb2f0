"""The code file of the registered models' pyfunc flavour (MLflow's models-from-code: MLflow
copies this file into each registered folder and runs it when the model is loaded, so no
pickled object is stored). The model itself lives in the installed `lattice` package."""

import mlflow

from lattice.registry.pyfunc import LatticePyfunc

mlflow.models.set_model(LatticePyfunc())
