"""Signatures, seals, tokens and the keys a deployment starts with."""
