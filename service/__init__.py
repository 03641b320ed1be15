"""service: the REST service, its dispatcher and the Optuna dashboard (see DESIGN.md)."""
