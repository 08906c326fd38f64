"""The plugin's own version (the single source for setup.py and the doctor)."""

__version__ = "0.1.0"
