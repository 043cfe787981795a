"""Ray plumbing: connecting to a cluster, the shared actor pool, Train/Tune helpers, metrics and run storage.

Only this package and ``experiments`` import Ray.
"""
