"""The contract the SDK, the coordinator and the workers share.

Torch-free, so that the coordinator can import it, except `fx/` (torch-side code the SDK
and the workers share): `wire/` (a request, its key, target, build and manifest),
`graph/` (graph validation), `kernels/` (Triton kernel requests), `trust/` (signatures,
seals, tokens), `storage/` (the Redis store and blobs). The command line (`cli/`) and the
local farm (`localfarm/`) sit above it, as their own packages.
"""

__version__ = "0.1.0"
