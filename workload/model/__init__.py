"""Training and results: hyperparameters, the trainer, metrics, the report and its plots, export and scoring."""
