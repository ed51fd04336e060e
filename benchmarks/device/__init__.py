"""Device harness: scripts run on the lent GPU machine (README.md), as
``python3 -m benchmarks.device.<module>`` from the repository root or from ``/opt/coloc/src``; job files
(``workloads.py``, ``job_*.sh``) run by path."""
