"""Declared settings sections (``schema``) and the sections themselves, one module each; see schema.py."""
