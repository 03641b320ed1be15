"""hpo: studies dispatched through Ray Tune, recorded in an Optuna storage (see DESIGN.md)."""
