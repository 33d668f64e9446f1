"""STAPO reproduction harness."""
__version__ = "0.1.0"
