"""Changing a dataset after packing: appends and views/splits."""
