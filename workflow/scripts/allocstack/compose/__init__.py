"""A Compose file as allocstack config (import_compose.py).
"""
