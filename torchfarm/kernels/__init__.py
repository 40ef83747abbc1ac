"""Triton kernel requests, checked before anything compiles them, and kernel binaries."""
