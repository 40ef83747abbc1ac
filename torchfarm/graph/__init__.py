"""The graph format's checks, torch-free: what a graph may call, and its bounds."""
