"""The stand-in's generation package."""
