"""One module per revision of the service's tables, oldest first."""
