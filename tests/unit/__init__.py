"""Unit tests of the plan: a package, so that its conftest and helpers never shadow tests/conftest.py."""
