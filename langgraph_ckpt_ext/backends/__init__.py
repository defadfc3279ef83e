"""Backends: each moves rows for `StoreCheckpointer`, nothing more."""
