"""`lattice tune`: hyperparameter search (Optuna) on the validation split. `space` is torch-free
(the config check imports it); `stages` runs the trials."""
