"""Script probe corpus: job folders as users write them, and the scripts that measure them
(docs/estimator.md)."""
