"""Torch-side code that the SDK and the workers both need: the graph format's encoder
(`encode`) and decoder (`decode`), shape guards (`guards`), the build fingerprint
(`fingerprint`) and C++ kernel specs (`cpp_kernels`, `hooks`). Imports torch; the
coordinator never imports this package."""
