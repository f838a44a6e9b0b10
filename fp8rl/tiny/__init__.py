"""The tiny CPU backend."""
