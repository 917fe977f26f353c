"""Shared facts at the bottom of the project: units, dtype sizes, config-tree walking, /proc reading,
the cores a process may use, model-parallel arithmetic and the admissible values of offload keys.

Nothing here imports another package of this project; everything else may import from here.
"""
