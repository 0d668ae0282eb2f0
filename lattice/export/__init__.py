"""Export of a trained model to a self-contained TorchScript artifact for serving."""
