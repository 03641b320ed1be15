"""The Ray side of hpo: searcher, schedulers, trainable, callback and the study driver.

Everything that imports Ray lives here and is imported lazily by the CLI and
the service's dispatcher, so that specs, storage and the API load without Ray.
"""
