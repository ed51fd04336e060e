"""Public probe corpus: unmodified upstream training scripts at pinned commits (README.md)."""
