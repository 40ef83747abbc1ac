"""Code shared by the SDK, the coordinator and the workers.

Everything in this package except `cli` and `stack` is torch-free, so that the
coordinator can import it: keys, manifests, the Redis store, the graph validator.
"""

__version__ = "0.1.0"
