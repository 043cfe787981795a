"""One folder per study: ``<study>/`` holds its code (``plan.py``, ``units.py``, ``report.py``), ``REPORT.md``, figures and
``records/``; the registry is ``benchmarks.study.STUDIES``; superseded studies are in ``archive/``."""
