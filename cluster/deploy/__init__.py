"""Bringing clusters up: `ray up` / KubeRay definitions and image (YAML, Dockerfile); real local nodes (local.py)."""
