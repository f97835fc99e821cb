"""The cubepack version, in a module with no imports so every module can read it."""

__version__ = "0.1.0"
